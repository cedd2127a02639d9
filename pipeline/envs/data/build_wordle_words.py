"""Rebuild ``wordle_words.txt``, the wordle word list (run once by hand; the game only reads the text file).

Needs two packages that are not Curio dependencies: ``pip install wordfreq english-words``. Words are taken
in wordfreq's English frequency order, kept when five lowercase letters and a lowercase entry of the
public-domain Webster's 2nd / GCIDE dictionaries, and dropped when a name, brand, slang contraction, slur or
vulgar word (BLOCK), or a plain inflection (-s / -es / -ed) of a shorter dictionary word.

    python pipeline/envs/data/build_wordle_words.py
"""

from pathlib import Path

import wordfreq
from english_words import get_english_words_set

SIZE = 2300
BLOCK = set("""
china japan trump peter henry harry lewis jimmy kelly roger clark maria billy larry barry jerry laura pussy terry
bobby perry tommy blake costa welsh nancy ralph colin chile singh satan betty honda marco randy riley jenny mommy
burke molly brett covid whore yahoo kerry walsh donna cyrus allan pablo silva pedro chang negro irene brock monte
hogan clive malik paddy willy benny sammy weber hanna patty peggy dover bowie dolly ariel jenna kylie chevy clint
tibet porto nicky ryder cisco patel reese sloan buffy julio wigan levin paolo cheng ching dixie tammy ethel gemma
norma rowan garth rufus bosch rhine timor fitch kodak missy slade bundy hasan rohan chico derry britt josie huron
erika seine darby liang macon bucky hurst tonga bafta savoy alamo amman marge reddy brill faust prius smyth arjun
dunne lohan parma tania cajun ginny groot hough vinny acton diddy snape dhoni boyer waugh tilly xviii xxiii posey
serra brant ganga hamza mirza myron camus barth sheng goran mavis surat razer hakim emmet dutch swiss inter didnt
wasnt arent youve gonna wanna gotta dunno bitch penis sperm horny dildo semen kinky titty twink boner booby queer
moron jihad lynch pubic panty gypsy fatty sissy xerox ascii crore sahib fecal labia vulva squaw chink ganja fatwa
skank spank dicky wench booty sexy nazis niger rapist slutty homo psych scifi rishi joshi vidya varna ronin masha
salma tulsi mitra morin matti hoyle boden peele layne lisle rance strom debby gilly nawab rabat minot cleve logie
sturt ansar alban chaka drago keita vardy busby timon berne laine coker steen zorro bilbo lindy reina seton rogan
pilar purdy lazar macao mille ortho boson chien abbas criss feces manus maris polis
""".split())

HEADER = """\
# Five-letter English words for wordle, most frequent first (one per line; '#' lines are comments).
# Built for Curio: wordfreq's English frequency ranking (wordfreq data: CC BY-SA 4.0, R. Speer) filtered to
# lowercase entries of the public-domain Webster's 2nd / GCIDE dictionaries, minus names, brands, slang
# contractions, slurs and vulgar words, minus plain inflections (-s / -es / -ed) of shorter words.
# All lines are allowed guesses; the first 1500 are the pool of secret words.
"""


def build() -> list[str]:
    dictionary = get_english_words_set(["web2", "gcide"], lower=False, alpha=True)
    ranked = wordfreq.top_n_list("en", 60000)
    short = {w for w in ranked if len(w) in (3, 4) and w.isalpha() and w in dictionary}
    words: list[str] = []
    for w in ranked:
        if len(w) != 5 or not (w.isascii() and w.isalpha() and w.islower()) or w not in dictionary or w in BLOCK:
            continue
        if (w.endswith("s") and w[:-1] in short) or (w.endswith("es") and w[:-2] in short):
            continue
        if w.endswith("ed") and (w[:-2] in short or w[:-1] in short):
            continue
        words.append(w)
        if len(words) == SIZE:
            break
    return words


if __name__ == "__main__":
    out = Path(__file__).with_name("wordle_words.txt")
    out.write_text(HEADER + "\n".join(build()) + "\n")
