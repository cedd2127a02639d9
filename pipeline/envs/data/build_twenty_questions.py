"""Writes ``twenty_questions.json``, the twenty-questions knowledge base, from the tables below.

The tables are attribute-major: for each yes/no attribute, the objects for which it is true (every other
object gets an explicit false). Reviewing one attribute across all categories at once is what keeps
cross-category facts honest (tables have legs, airplanes have tails and wings, tennis rackets have strings).
The JSON is the committed artefact the game reads; rerun this after editing a table:

    python pipeline/envs/data/build_twenty_questions.py
"""

from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).with_name("twenty_questions.json")

PROMPTS = {
    "system": (
        "We are playing twenty questions. I am thinking of a secret object: find it by asking questions I can "
        "answer with yes or no, then guess it. Write every reply as <Answer>your question</Answer>."
    ),
    "first": "You are trying to guess {article} {category}. Ask your first question!",
    "guess": "Is it {article} {name}?",
    "yes": "Yes.",
    "no": "No.",
    "goal": "Goal reached",
    "unknown": "Sorry, I cannot answer this question.",
    "over": "The game is over.",
}

# category -> [(name, synonyms)]
CATEGORIES: dict[str, list[tuple[str, list[str]]]] = {
    "mammal": [
        ("dog", ["puppy", "hound"]), ("cat", ["kitten", "kitty"]), ("rabbit", ["bunny"]), ("horse", ["pony"]),
        ("cow", ["cattle"]), ("pig", ["hog", "swine"]), ("sheep", ["lamb"]), ("lion", []), ("tiger", []),
        ("elephant", []), ("giraffe", []), ("zebra", []), ("bear", []), ("monkey", []), ("kangaroo", []),
        ("bat", []), ("mouse", []),
    ],
    "bird": [
        ("eagle", []), ("owl", []), ("penguin", []), ("ostrich", []), ("parrot", []),
        ("chicken", ["hen", "rooster"]), ("duck", []), ("swan", []), ("pigeon", []), ("crow", []),
        ("flamingo", []), ("peacock", ["peafowl"]),
        ("hummingbird", []), ("woodpecker", []), ("seagull", ["gull"]), ("turkey", []),
    ],
    "sea creature": [
        ("shark", []), ("whale", []), ("dolphin", []), ("octopus", []), ("squid", []), ("jellyfish", []),
        ("crab", []), ("lobster", []), ("shrimp", ["prawn"]), ("starfish", ["sea star"]), ("seahorse", []),
        ("salmon", []), ("tuna", []), ("clownfish", []), ("sea turtle", ["turtle"]), ("oyster", []),
    ],
    "fruit": [
        ("apple", []), ("banana", []), ("orange", []), ("grape", []), ("strawberry", []), ("watermelon", []),
        ("pineapple", []), ("mango", []), ("lemon", []), ("cherry", []), ("peach", []), ("pear", []),
        ("blueberry", []), ("coconut", []), ("kiwi", ["kiwifruit", "kiwi fruit"]), ("avocado", []),
    ],
    "vegetable": [
        ("carrot", []), ("potato", []), ("sweet potato", []), ("onion", []), ("garlic", []), ("broccoli", []),
        ("cauliflower", []), ("cabbage", []), ("lettuce", []), ("cucumber", []), ("corn", ["maize", "sweetcorn"]),
        ("pumpkin", []), ("celery", []), ("mushroom", []), ("eggplant", ["aubergine"]), ("pea", ["peas"]),
    ],
    "vehicle": [
        ("car", ["automobile"]), ("bus", []), ("truck", ["lorry"]), ("fire truck", ["fire engine"]),
        ("ambulance", []), ("tractor", []), ("motorcycle", ["motorbike"]), ("bicycle", ["bike"]), ("train", []),
        ("airplane", ["plane", "aeroplane", "aircraft"]), ("helicopter", []), ("rocket", []),
        ("sailboat", ["sailing boat"]), ("ship", []), ("submarine", []), ("canoe", []),
    ],
    "tool": [
        ("hammer", []), ("screwdriver", []), ("wrench", ["spanner"]), ("saw", []), ("drill", []), ("axe", ["ax"]),
        ("shovel", ["spade"]), ("rake", []), ("toolbox", ["tool box"]), ("ladder", []), ("tape measure", []),
        ("paintbrush", ["paint brush"]), ("nail", []), ("wheelbarrow", []), ("lawn mower", ["lawnmower", "mower"]),
        ("flashlight", ["torch"]),
    ],
    "kitchen item": [
        ("knife", []), ("fork", []), ("spoon", []), ("plate", []), ("bowl", []), ("mug", ["coffee mug"]),
        ("frying pan", ["pan", "skillet"]), ("pot", ["saucepan", "cooking pot"]), ("kettle", []), ("toaster", []),
        ("blender", []), ("refrigerator", ["fridge"]), ("microwave", ["microwave oven"]), ("whisk", []),
        ("cutting board", ["chopping board"]), ("rolling pin", []),
    ],
    "furniture": [
        ("chair", []), ("table", []), ("bed", []), ("sofa", ["couch", "settee"]), ("desk", []),
        ("bookshelf", ["bookcase"]), ("wardrobe", ["armoire"]), ("stool", []), ("bench", []),
        ("dresser", ["chest of drawers"]), ("rocking chair", []), ("crib", ["cot"]), ("hammock", []), ("lamp", []),
        ("rug", ["carpet"]),
    ],
    "musical instrument": [
        ("piano", []), ("guitar", []), ("violin", ["fiddle"]), ("cello", []), ("harp", []), ("drum", []),
        ("xylophone", []), ("tambourine", []), ("triangle", []), ("flute", []), ("clarinet", []), ("trumpet", []),
        ("trombone", []), ("saxophone", ["sax"]), ("harmonica", ["mouth organ"]), ("accordion", []),
    ],
    "clothing": [
        ("shirt", []), ("dress", []), ("skirt", []), ("coat", []), ("sweater", ["jumper", "pullover"]),
        ("hat", []), ("shoe", []), ("boot", []), ("sock", []), ("glove", []), ("scarf", []), ("tie", ["necktie"]),
        ("belt", []), ("sandal", []), ("swimsuit", ["bathing suit", "swimming costume"]), ("apron", []),
    ],
    "sport equipment": [
        ("basketball", []), ("soccer ball", ["football"]), ("volleyball", []), ("tennis ball", []),
        ("baseball", []), ("golf ball", []), ("bowling ball", []), ("tennis racket", ["tennis racquet", "racket"]),
        ("baseball bat", []), ("golf club", []), ("hockey stick", []), ("skateboard", []), ("surfboard", []),
        ("ski", []), ("helmet", []), ("dumbbell", []),
    ],
    "electronic device": [
        ("television", ["tv", "telly"]), ("smartphone", ["phone", "mobile phone", "cell phone", "cellphone"]),
        ("laptop", ["laptop computer"]), ("desktop computer", ["computer", "pc"]), ("tablet", []),
        ("camera", []), ("radio", []), ("microphone", ["mic"]), ("remote control", ["remote"]),
        ("calculator", []), ("printer", []), ("smartwatch", ["smart watch"]),
        ("game console", ["games console", "video game console", "console"]),
        ("vacuum cleaner", ["vacuum", "hoover"]), ("hair dryer", ["hairdryer", "blow dryer"]),
        ("washing machine", ["washer"]),
    ],
}

# (id, canonical question, paraphrases, keywords, note on how the table was filled)
ATTRIBUTES: list[tuple[str, str, list[str], list[str], str]] = [
    # -- what kind of thing ---------------------------------------------------------------------------------------
    ("alive", "Is it alive?",
     ["Is it a living thing?", "Is it living?", "Is it a living creature?", "Is it a living being?"],
     ["alive", "living"], "a living creature; harvested fruit and vegetables count as not alive"),
    ("animal", "Is it an animal?", ["Is it a creature?"], ["animal", "animals", "creature"], ""),
    ("mammal", "Is it a mammal?", ["Is it a kind of mammal?"], ["mammal", "mammals"],
     "whales and dolphins are mammals"),
    ("bird", "Is it a bird?", ["Does it have feathers?"], ["bird", "birds", "feathers", "feathered"], ""),
    ("fish", "Is it a fish?", ["Is it a kind of fish?"], ["fish", "fishes"],
     "true fish only: whales, octopuses and crabs are not fish"),
    ("food", "Do people commonly eat it?", ["Is it a food?", "Can you eat it?", "Is it edible?", "Is it food?"],
     ["edible", "food", "eaten", "seafood"], "commonly eaten in much of the world (as meat or seafood counts)"),
    ("plant_part", "Is it part of a plant?", ["Does it come from a plant?", "Does it grow on a plant?",
                                              "Is it a plant?"],
     ["plant", "plants"], "fruit and vegetables; a mushroom is a fungus, not a plant"),
    ("manmade", "Is it made by people?", ["Is it man-made?", "Is it manufactured?", "Is it artificial?"],
     ["man made", "manmade", "human made", "manufactured", "artificial", "made by humans"], ""),
    ("fruit", "Is it a fruit?", ["Is it a kind of fruit?"], ["fruit", "fruits"],
     "the fruit category; these category questions follow the game's categories"),
    ("vegetable", "Is it a vegetable?", ["Is it a veggie?"], ["vegetable", "vegetables", "veggie"], ""),
    ("vehicle", "Is it a vehicle?", ["Is it a means of transport?", "Is it a form of transportation?"],
     ["vehicle", "vehicles", "transport", "transportation"], ""),
    ("tool", "Is it a tool?", ["Is it a kind of tool?"], ["tool", "tools"],
     "the tool category; kitchen utensils are kitchen items"),
    ("furniture", "Is it furniture?", ["Is it a piece of furniture?", "Is it a furniture?"], ["furniture"], ""),
    ("clothing", "Is it clothing?", ["Is it a piece of clothing?", "Is it clothes?", "Is it an item of clothing?"],
     ["clothing", "clothes", "garment", "apparel"], ""),
    ("electronic", "Is it an electronic device?", ["Is it electronic?", "Is it a gadget?", "Is it a device?"],
     ["electronic", "electronics", "gadget", "device"], ""),
    # -- size and shape -------------------------------------------------------------------------------------------
    ("tiny", "Is it smaller than a golf ball?", ["Is it very small?", "Is it tiny?"],
     ["smaller than a golf ball", "tiny", "very small"], ""),
    ("pocket", "Can it fit in your pocket?",
     ["Is it small enough to fit in a pocket?", "Does it fit in a pocket?"],
     ["pocket"], "by size"),
    ("breadbox", "Is it bigger than a breadbox?", ["Is it larger than a breadbox?", "Is it big?"],
     ["bigger than a breadbox", "larger than a breadbox", "bigger than a bread box", "larger than a bread box"],
     "takes up more room than a breadbox (about 40 x 25 x 20 cm), or is a metre long"),
    ("bigger_person", "Is it bigger than a person?", ["Is it larger than a person?", "Is it bigger than a human?",
                                                      "Is it larger than a human?"],
     ["bigger than a person", "larger than a person", "bigger than a human", "larger than a human"],
     "clearly larger than an adult overall"),
    ("bigger_car", "Is it bigger than a car?", ["Is it larger than a car?"],
     ["bigger than a car", "larger than a car"], ""),
    ("round", "Is it round like a ball?", ["Is it round?", "Is it spherical?", "Is it ball-shaped?"],
     ["round", "spherical", "sphere", "ball shaped"], "ball-shaped; a plate is flat, not round like a ball"),
    ("long_thin", "Is it long and thin?", ["Is it long?", "Is it thin?", "Is it elongated?"],
     ["long and thin", "thin", "elongated", "skinny"], ""),
    ("flat", "Is it flat?", ["Is it flat in shape?"], ["flat"],
     "thin and flat overall; a flat top does not make a table flat"),
    # -- what it is made of ---------------------------------------------------------------------------------------
    ("metal", "Is it made of metal?", ["Is it metallic?", "Is it made out of metal?"],
     ["metal", "metallic", "steel", "iron", "aluminium", "aluminum"], "made mostly of metal"),
    ("wood", "Is it made of wood?", ["Is it wooden?", "Is it made out of wood?"], ["wood", "wooden"],
     "usually made mostly of wood"),
    ("plastic", "Is it made of plastic?", ["Is it plastic?", "Is it made out of plastic?"], ["plastic"],
     "usually made mostly of plastic"),
    ("fabric", "Is it made of cloth?",
     ["Is it made of fabric?", "Is it made of textile?", "Is it made of material?"],
     ["cloth", "fabric", "textile", "cotton", "wool"], ""),
    # -- body -----------------------------------------------------------------------------------------------------
    ("fur", "Does it have fur?", ["Is it furry?", "Is it covered in fur?"], ["fur", "furry"],
     "elephants and pigs have sparse hair or bristles, not fur"),
    ("shell", "Does it have a shell?", ["Does it have a hard shell?"], ["shell", "shells"], "a hard outer shell"),
    ("legs", "Does it have legs?", ["Does it have any legs?"], ["legs", "leg"],
     "walking legs or furniture legs; an octopus has arms, a sea turtle flippers"),
    ("four_legs", "Does it have four legs?", ["Does it walk on four legs?", "Does it walk on all fours?"],
     ["four legs", "4 legs", "all fours"],
     "exactly four legs as a rule; monkeys and kangaroos have arms and legs"),
    ("tail", "Does it have a tail?", ["Has it got a tail?"], ["tail", "tails"],
     "an airplane's or helicopter's tail counts"),
    ("fins", "Does it have fins?", ["Has it got fins?"], ["fin", "fins"],
     "a surfboard's or rocket's fins count; flippers do not"),
    ("tentacles", "Does it have tentacles?", ["Has it got tentacles?"], ["tentacle", "tentacles"],
     "an octopus's arms count"),
    ("hooves", "Does it have hooves?", ["Has it got hooves?"], ["hoof", "hooves", "hoofed"], ""),
    ("pouch", "Does it have a pouch?", ["Does it carry its baby in a pouch?"], ["pouch"], ""),
    ("long_neck", "Does it have a long neck?", ["Is its neck long?"], ["long neck", "neck"], "animals"),
    ("stripes", "Does it have stripes?", ["Is it striped?"], ["stripe", "stripes", "striped"], ""),
    ("wings", "Does it have wings?", ["Has it got wings?"], ["wing", "wings"],
     "penguins and ostriches have wings; so do airplanes"),
    # -- how it lives ---------------------------------------------------------------------------------------------
    ("flies", "Can it fly?", ["Does it fly?", "Is it able to fly?"], ["fly", "flies", "flying", "flight"],
     "even short flights count (a chicken can flutter up)"),
    ("lives_in_water", "Does it live in water?", ["Is it aquatic?", "Does it live in the sea?",
                                                  "Does it live in the ocean?"],
     ["live in water", "lives in water", "aquatic", "sea", "ocean", "underwater"],
     "spends its whole life in water"),
    ("freshwater", "Does it live in rivers or lakes?", ["Does it live in fresh water?", "Does it live in a lake?",
                                                     "Does it live in a river?"],
     ["river", "rivers", "lake", "lakes", "fresh water", "freshwater"], "animals; salmon swim up rivers to breed"),
    ("water", "Is it found in water?", ["Is it usually found in or on water?", "Is it used on water?",
                                        "Is it found on water?"],
     ["water", "pond"], "water animals, water birds, boats and water gear"),
    ("underwater", "Can it go underwater?", ["Can it dive?", "Can it go under water?"],
     ["go underwater", "dive", "dives", "diving"], "lives or dives under water as a habit"),
    ("breathes_air", "Does it breathe air?", ["Does it have lungs?", "Does it breathe?"],
     ["breathe", "breathes", "breathing", "lungs"], ""),
    ("pet", "Is it a common pet?", ["Is it a pet?", "Do people keep it as a pet?", "Is it kept as a pet?"],
     ["pet", "pets"], "a common household pet"),
    ("farm", "Is it found on a farm?",
     ["Is it a farm animal?", "Is it used on a farm?", "Does it live on a farm?"],
     ["farm", "farms", "livestock", "farmer"], "kept or used mainly on farms"),
    ("wild", "Does it live in the wild?", ["Is it a wild animal?", "Is it wild?"], ["wild"],
     "wild populations are common; ducks, rabbits and turkeys are both farmed and wild"),
    ("predator", "Does it hunt other animals?", ["Is it a predator?", "Does it hunt?"],
     ["hunt", "hunts", "hunting", "predator", "prey"],
     "hunts fish, birds or mammals, not only insects or plankton"),
    ("nocturnal", "Is it nocturnal?", ["Is it active at night?", "Does it come out at night?"],
     ["nocturnal", "night"], "mainly active at night"),
    ("climbs", "Does it climb trees?", ["Can it climb trees?", "Does it climb?"], ["climb", "climbs", "climbing"],
     ""),
    # -- getting around -------------------------------------------------------------------------------------------
    ("ride", "Can people ride it?", ["Can people ride in it or on it?", "Can it carry people?", "Can you ride in it?"],
     ["ride", "riding", "carry people"], ""),
    ("many_people", "Can it carry many people?", ["Can it carry lots of people at once?",
                                                  "Does it carry passengers?"],
     ["passengers", "lots of people", "many people", "public transport"], ""),
    ("wheels", "Does it have wheels?", ["Does it have a wheel?"], ["wheel", "wheels"], ""),
    ("two_wheels", "Does it have two wheels?", ["Does it have only two wheels?"], ["two wheels"], ""),
    ("engine", "Does it have an engine?", ["Does it have a motor?", "Does it use fuel?"],
     ["engine", "engines", "fuel", "petrol", "gasoline", "motor"],
     "an engine that drives it; small electric motors in appliances do not count"),
    ("siren", "Does it have a siren?", ["Is it an emergency vehicle?"], ["siren", "emergency"], ""),
    ("doors", "Does it have doors?", ["Does it have a door?"], ["door", "doors"],
     "a door you open to get in or to reach inside; hatches do not count"),
    # -- electricity ----------------------------------------------------------------------------------------------
    ("electric", "Does it use electricity?", ["Is it electric?", "Do you plug it in?", "Does it need power?",
                                              "Does it run on electricity?"],
     ["electricity", "electric", "plug", "plugged", "power"], "needs electricity to do its main job"),
    ("battery", "Does it run on batteries?", ["Does it use batteries?", "Is it battery powered?"],
     ["battery", "batteries", "rechargeable"], "commonly battery powered"),
    ("screen", "Does it have a screen?", ["Does it have a display?"], ["screen", "display", "monitor"], ""),
    ("internet", "Can it connect to the internet?", ["Does it use the internet?", "Can it go online?"],
     ["internet", "online", "wifi", "wi fi"], ""),
    ("photos", "Can it take photos?", ["Does it have a camera?", "Can it take pictures?"],
     ["photo", "photos", "picture", "pictures", "photograph"], ""),
    ("speaker", "Does it have a speaker?", ["Does it have speakers?", "Can it play sound?"],
     ["speaker", "speakers", "loudspeaker"], ""),
    ("keys", "Does it have keys?", ["Does it have a keyboard?"], ["keys", "keyboard"],
     "a keyboard, or the keys of a woodwind instrument"),
    ("light", "Is it used to give light?", ["Does it give off light?", "Is it a light?", "Does it light up?"],
     ["give light", "gives light", "light up", "lights up", "illuminate", "glow", "shine"],
     "giving light is its job"),
    # -- music ----------------------------------------------------------------------------------------------------
    ("music", "Is it used to make music?", ["Is it a musical instrument?", "Is it an instrument?",
                                            "Can you play music with it?"],
     ["music", "musical", "instrument", "instruments"], ""),
    ("strings", "Does it have strings?", ["Has it got strings?"], ["string", "strings", "stringed"],
     "a tennis racket has strings"),
    ("blow", "Do you blow into it?", ["Is it a wind instrument?", "Do you blow it?"],
     ["blow", "blowing", "wind instrument", "woodwind", "brass"], ""),
    ("percussion", "Is it a percussion instrument?", ["Do you hit it to play it?", "Is it played by hitting it?"],
     ["percussion", "drum", "drums"], ""),
    ("bow", "Is it played with a bow?", ["Do you use a bow to play it?"], ["bow"], ""),
    ("held", "Do you hold it while you play it?", ["Is it held while played?", "Do you hold it in your hands?"],
     ["held while played", "hold it while"],
     "musical instruments held up by the player, not resting on the floor or a stand"),
    ("melody", "Can it play a melody?", ["Can it play different notes?", "Can it play a tune?"],
     ["melody", "melodies", "tune", "tunes", "musical notes"],
     "musical instruments that play tunes, not only beats"),
    # -- kitchen --------------------------------------------------------------------------------------------------
    ("kitchen", "Is it kitchen equipment?", ["Is it used to prepare or serve food?", "Is it a kitchen utensil?",
                                             "Is it used in the kitchen?", "Is it used for cooking?"],
     ["kitchen", "utensil", "cooking", "cook", "cookware"], "kitchen equipment, not the food itself"),
    ("heat", "Is it used to heat things?", ["Does it get hot?", "Does it heat things?", "Does it make heat?"],
     ["heat", "heats", "heating", "get hot", "gets hot"], "heating is its job"),
    ("cuts", "Is it used for cutting?",
     ["Can it cut things?", "Does it have a blade?", "Is it used to cut things?"],
     ["cut", "cuts", "cutting", "blade", "blades", "chop"], ""),
    ("liquid", "Can it hold liquid?", ["Can you put water in it?", "Can it hold water?"],
     ["liquid", "liquids", "hold water"], "made to hold liquid"),
    ("drink", "Do you drink from it?", ["Is it used for drinking?"], ["drink", "drinking"], ""),
    ("tableware", "Is it tableware?", ["Is it used at the table when eating?", "Do you eat with it?"],
     ["eat with", "tableware", "cutlery", "dinner table", "silverware"], "cutlery, plates, bowls and mugs"),
    # -- furniture ------------------------------------------------------------------------------------------------
    ("sit", "Is it made for sitting on?", ["Is it a seat?", "Is it for sitting?", "Do you sit on it?"],
     ["sit", "sitting", "seat"], "furniture made as a seat"),
    ("backrest", "Does it have a backrest?", ["Does it have a back?"], ["backrest", "back rest"],
     "a seat with a back to lean on; benches come both ways and count as without"),
    ("several", "Is it a seat for several people?", ["Can several people sit on it?", "Is it a long seat?"],
     ["several people", "more than one person"], "furniture"),
    ("lie", "Do people lie down on it?", ["Do you sleep on it?", "Do people sleep on it?", "Can you lie on it?"],
     ["lie down", "sleep", "sleeping", "lie on"], ""),
    ("storage", "Is it used to store things?", ["Is it used for storage?", "Do you keep things in it?"],
     ["storage", "storing", "store things", "keep things"], ""),
    ("drawers", "Does it have drawers?", ["Has it got drawers?"], ["drawer", "drawers"], ""),
    ("rocks", "Does it rock or swing?", ["Does it swing?", "Does it rock?"],
     ["rocking", "swing", "swings", "sway"], ""),
    # -- clothing -------------------------------------------------------------------------------------------------
    ("worn", "Do you wear it?", ["Is it worn?", "Can you wear it?", "Is it something you wear?"],
     ["wear", "worn", "wearing"], ""),
    ("feet", "Is it worn on the feet?", ["Do you wear it on your feet?"], ["feet", "foot", "footwear"], ""),
    ("ankle", "Does it cover the ankle?", ["Does it cover your ankles?"], ["ankle", "ankles"], ""),
    ("head", "Is it worn on the head?", ["Do you wear it on your head?"], ["head"], ""),
    ("hands", "Is it worn on the hands?", ["Do you wear it on your hands?"], ["hands", "gloves"], ""),
    ("neck", "Is it worn around the neck?", ["Do you wear it around your neck?"], ["around the neck"], ""),
    ("warm", "Is it worn to keep warm?", ["Does it keep you warm?", "Is it worn in cold weather?"],
     ["keep warm", "keeps you warm", "cold weather", "winter"], "worn mainly against the cold"),
    ("upper", "Is it worn on the upper body?", ["Does it cover the chest?"], ["upper body", "chest", "torso"], ""),
    ("lower", "Is it worn on the lower body?", ["Does it cover the legs?", "Does it cover the hips?"],
     ["lower body", "hips", "waist"], "covers the hips or legs"),
    ("women", "Is it mostly worn by women?", ["Is it worn by women?", "Is it for women?"],
     ["women", "woman", "girls", "female"], ""),
    ("pairs", "Does it come in pairs?", ["Is it used in pairs?", "Do you use two of them?"],
     ["pair", "pairs"], ""),
    ("summer", "Is it worn mainly in summer?", ["Is it worn in hot weather?", "Is it for summer?"],
     ["summer", "hot weather", "beach"], ""),
    # -- sport and chores -----------------------------------------------------------------------------------------
    ("ball", "Is it a ball?", ["Is it some kind of ball?"], ["ball"], ""),
    ("air", "Is it filled with air?", ["Is it inflated?", "Do you inflate it?", "Is it inflatable?"],
     ["filled with air", "inflate", "inflated", "inflatable"], "inflated or pressurised"),
    ("team", "Is it used in a team sport?", ["Is it used in team sports?"], ["team", "teams"], ""),
    ("hit", "Is it used to hit things?", ["Do you hit things with it?", "Do you swing it?"],
     ["hit", "hitting", "strike", "smash"], "swung to strike nails or balls"),
    ("sport", "Is it used for sports?", ["Is it sports equipment?", "Is it used to play a sport?",
                                         "Is it used in sports?"],
     ["sport", "sports", "athletic"], "made mainly for a sport"),
    ("garden", "Is it used in the garden?", ["Is it a gardening tool?", "Is it used for gardening?"],
     ["garden", "gardening", "yard", "lawn"], ""),
    ("dig", "Is it used for digging?", ["Do you dig with it?"], ["dig", "digging", "dig holes"], ""),
    ("cleaning", "Is it used for cleaning?", ["Does it clean things?"], ["clean", "cleaning", "cleans", "wash"],
     ""),
    # -- fruit and vegetables -------------------------------------------------------------------------------------
    ("sweet", "Does it taste sweet?", ["Is it sweet?"], ["sweet", "sugar", "sugary"], ""),
    ("sour", "Does it taste sour?", ["Is it sour?"], ["sour", "tart", "acidic"], ""),
    ("raw", "Can you eat it raw?", ["Is it eaten raw?", "Can it be eaten raw?"], ["raw", "uncooked"],
     "safe and usual to eat uncooked"),
    ("underground", "Does it grow underground?", ["Does it grow in the ground?", "Is it a root vegetable?"],
     ["underground", "root", "roots", "soil", "in the ground"], "the part people eat grows underground"),
    ("tree", "Does it grow on a tree?", ["Does it grow on trees?"], ["tree", "trees"],
     "including tree-like plants such as the banana plant"),
    ("vine", "Does it grow on a vine?", ["Does it grow on vines?"], ["vine", "vines"],
     "vines and trailing plants"),
    ("leaves", "Do people eat its leaves?", ["Is it a leafy vegetable?", "Is it leafy?", "Is it a leafy green?"],
     ["leaf", "leaves", "leafy"], ""),
    ("pit", "Does it have a pit?", ["Does it have a stone?", "Does it have one big seed?"], ["pit", "pits"],
     "a single large seed"),
    ("peel", "Do you peel it?", ["Do you remove its skin before eating it?", "Does it have a peel?",
                                 "Do you have to peel it?"],
     ["peel", "peeled", "rind", "husk"], "fruit and vegetables whose peel, rind or husk is not eaten"),
    ("citrus", "Is it a citrus fruit?", ["Is it citrus?"], ["citrus"], ""),
    ("tropical", "Does it grow in tropical places?", ["Is it tropical?", "Is it a tropical fruit?"],
     ["tropical", "tropics"], "fruit grown mainly in the tropics"),
    ("smell", "Does it have a strong smell?", ["Is it smelly?", "Does it smell strongly?"],
     ["smell", "smelly", "odor", "odour"], ""),
    # -- colour: the colour people usually picture; things that come in any colour have none ----------------------
    ("red", "Is it red?", ["Is it usually red?", "Is it red in color?"], ["red"], ""),
    ("orange", "Is it orange?", ["Is it usually orange?", "Is it orange in color?"], ["orange"], ""),
    ("yellow", "Is it yellow?", ["Is it usually yellow?", "Is it yellow in color?"], ["yellow"], ""),
    ("green", "Is it green?", ["Is it usually green?", "Is it green in color?"], ["green"], ""),
    ("blue", "Is it blue?", ["Is it usually blue?", "Is it blue in color?"], ["blue"], ""),
    ("purple", "Is it purple?", ["Is it usually purple?", "Is it purple in color?"], ["purple", "violet"], ""),
    ("pink", "Is it pink?", ["Is it usually pink?", "Is it pink in color?"], ["pink"], ""),
    ("brown", "Is it brown?", ["Is it usually brown?", "Is it brown in color?"], ["brown"], ""),
    ("black", "Is it black?", ["Is it usually black?", "Is it black in color?"], ["black"], ""),
    ("white", "Is it white?", ["Is it usually white?", "Is it white in color?"], ["white"], ""),
    ("grey", "Is it grey?", ["Is it gray?", "Is it usually grey?", "Is it grey in color?"], ["grey", "gray"], ""),
]

# attribute -> the objects for which it is true: names, "@category" for a whole category, "-name" to take one out
TRUE_FOR: dict[str, str] = {
    "alive": "@mammal, @bird, @sea creature",
    "animal": "@mammal, @bird, @sea creature",
    "mammal": "@mammal, whale, dolphin",
    "bird": "@bird",
    "fish": "shark, seahorse, salmon, tuna, clownfish",
    "food": "@fruit, @vegetable, cow, pig, sheep, chicken, duck, turkey, octopus, squid, crab, lobster, shrimp, "
            "salmon, tuna, oyster",
    "plant_part": "@fruit, @vegetable, -mushroom",
    "fruit": "@fruit",
    "vegetable": "@vegetable",
    "vehicle": "@vehicle",
    "tool": "@tool",
    "furniture": "@furniture",
    "clothing": "@clothing",
    "electronic": "@electronic device",
    "manmade": "@vehicle, @tool, @kitchen item, @furniture, @musical instrument, @clothing, @sport equipment, "
               "@electronic device",
    "tiny": "grape, strawberry, cherry, blueberry, pea, nail",
    "pocket": "mouse, bat, hummingbird, clownfish, seahorse, shrimp, oyster, grape, strawberry, cherry, "
              "blueberry, pea, garlic, mushroom, nail, tape measure, sock, glove, tie, harmonica, golf ball, "
              "tennis ball, smartphone, remote control, calculator, smartwatch",
    "breadbox": "@mammal, -rabbit, -bat, -mouse, eagle, penguin, ostrich, swan, flamingo, peacock, turkey, "
                "shark, whale, dolphin, octopus, salmon, tuna, sea turtle, @vehicle, ladder, wheelbarrow, "
                "lawn mower, shovel, rake, refrigerator, microwave, @furniture, piano, guitar, cello, harp, "
                "drum, xylophone, trombone, saxophone, coat, dress, surfboard, ski, hockey stick, golf club, "
                "television, desktop computer, printer, vacuum cleaner, washing machine",
    "bigger_person": "horse, cow, lion, tiger, elephant, giraffe, zebra, bear, ostrich, shark, whale, dolphin, "
                     "@vehicle, -bicycle, ladder, bed, sofa, wardrobe, bookshelf, piano, refrigerator",
    "bigger_car": "elephant, giraffe, whale, bus, truck, fire truck, ambulance, tractor, train, airplane, "
                  "helicopter, rocket, sailboat, ship, submarine",
    "round": "apple, orange, grape, cherry, peach, blueberry, watermelon, coconut, pea, onion, cabbage, "
             "pumpkin, basketball, soccer ball, volleyball, tennis ball, baseball, golf ball, bowling ball",
    "long_thin": "banana, carrot, celery, cucumber, corn, train, rocket, canoe, screwdriver, nail, paintbrush, "
                 "shovel, rake, knife, fork, spoon, whisk, rolling pin, flute, clarinet, tie, scarf, belt, "
                 "baseball bat, golf club, hockey stick, ski",
    "flat": "starfish, saw, plate, cutting board, rug, skateboard, surfboard, ski, television, smartphone, "
            "laptop, tablet, calculator",
    "metal": "car, bus, truck, fire truck, ambulance, tractor, motorcycle, bicycle, train, airplane, "
             "helicopter, rocket, ship, submarine, hammer, screwdriver, wrench, saw, axe, shovel, rake, ladder, "
             "tape measure, nail, wheelbarrow, lawn mower, knife, fork, spoon, frying pan, pot, kettle, "
             "toaster, refrigerator, microwave, whisk, triangle, flute, trumpet, trombone, saxophone, "
             "harmonica, golf club, dumbbell, washing machine",
    "wood": "canoe, paintbrush, cutting board, rolling pin, chair, table, bed, desk, bookshelf, wardrobe, "
            "stool, bench, dresser, rocking chair, crib, piano, guitar, violin, cello, harp, drum, xylophone, "
            "clarinet, baseball bat, hockey stick, skateboard",
    "plastic": "drill, toolbox, flashlight, blender, helmet, radio, remote control, calculator, printer, "
               "game console, vacuum cleaner, hair dryer",
    "fabric": "@clothing, -shoe, -boot, -sandal, -belt, sofa, hammock, rug",
    "fur": "@mammal, -elephant, -pig",
    "shell": "crab, lobster, shrimp, sea turtle, oyster, coconut",
    "legs": "@mammal, @bird, crab, lobster, shrimp, chair, table, bed, sofa, desk, stool, bench, rocking chair, "
            "crib, piano",
    "four_legs": "dog, cat, rabbit, horse, cow, pig, sheep, lion, tiger, elephant, giraffe, zebra, bear, mouse, "
                 "chair, table, bed, sofa, desk, rocking chair, crib",
    "tail": "@mammal, @bird, shark, whale, dolphin, lobster, shrimp, seahorse, salmon, tuna, clownfish, "
            "sea turtle, airplane, helicopter",
    "fins": "shark, whale, dolphin, squid, seahorse, salmon, tuna, clownfish, rocket, surfboard",
    "tentacles": "octopus, squid, jellyfish",
    "pouch": "kangaroo",
    "hooves": "horse, cow, pig, sheep, giraffe, zebra",
    "long_neck": "giraffe, ostrich, flamingo, swan",
    "stripes": "tiger, zebra, clownfish, watermelon",
    "wings": "@bird, bat, airplane",
    "flies": "@bird, -penguin, -ostrich, bat, airplane, helicopter, rocket",
    "lives_in_water": "@sea creature",
    "freshwater": "duck, swan, flamingo, salmon",
    "water": "@sea creature, penguin, duck, swan, flamingo, seagull, sailboat, ship, submarine, canoe, "
             "surfboard, swimsuit",
    "underwater": "@sea creature, penguin, duck, submarine",
    "breathes_air": "@mammal, @bird, whale, dolphin, sea turtle",
    "pet": "dog, cat, rabbit, parrot",
    "farm": "horse, cow, pig, sheep, chicken, duck, turkey, tractor",
    "wild": "rabbit, lion, tiger, elephant, giraffe, zebra, bear, monkey, kangaroo, bat, mouse, @bird, "
            "-chicken, @sea creature",
    "predator": "cat, lion, tiger, bear, eagle, owl, penguin, seagull, shark, dolphin, octopus, squid, salmon, "
                "tuna",
    "nocturnal": "lion, tiger, bat, mouse, owl",
    "climbs": "cat, bear, monkey",
    "ride": "horse, elephant, @vehicle, skateboard, surfboard",
    "many_people": "bus, train, airplane, ship, submarine",
    "wheels": "car, bus, truck, fire truck, ambulance, tractor, motorcycle, bicycle, train, airplane, "
              "wheelbarrow, lawn mower, skateboard, vacuum cleaner",
    "engine": "car, bus, truck, fire truck, ambulance, tractor, motorcycle, train, airplane, helicopter, "
              "rocket, ship, submarine, lawn mower",
    "two_wheels": "motorcycle, bicycle",
    "siren": "fire truck, ambulance",
    "doors": "car, bus, truck, fire truck, ambulance, tractor, train, airplane, helicopter, refrigerator, "
             "microwave, wardrobe, washing machine",
    "electric": "train, drill, flashlight, kettle, toaster, blender, refrigerator, microwave, lamp, "
                "@electronic device",
    "battery": "drill, flashlight, smartphone, laptop, tablet, camera, radio, remote control, calculator, "
               "smartwatch",
    "screen": "television, smartphone, laptop, desktop computer, tablet, camera, calculator, smartwatch",
    "internet": "television, smartphone, laptop, desktop computer, tablet, smartwatch, game console",
    "photos": "smartphone, laptop, tablet, camera",
    "speaker": "television, smartphone, laptop, tablet, radio, smartwatch",
    "keys": "piano, flute, clarinet, saxophone, accordion, laptop, desktop computer, calculator",
    "light": "flashlight, lamp",
    "music": "@musical instrument",
    "strings": "piano, guitar, violin, cello, harp, apron, tennis racket",
    "blow": "flute, clarinet, trumpet, trombone, saxophone, harmonica",
    "percussion": "drum, xylophone, tambourine, triangle",
    "bow": "violin, cello",
    "held": "guitar, violin, tambourine, triangle, flute, clarinet, trumpet, trombone, saxophone, harmonica, "
            "accordion",
    "melody": "@musical instrument, -drum, -tambourine, -triangle",
    "kitchen": "@kitchen item",
    "heat": "frying pan, pot, kettle, toaster, microwave, hair dryer",
    "cuts": "saw, axe, lawn mower, knife",
    "liquid": "spoon, bowl, mug, pot, kettle, blender",
    "drink": "mug",
    "tableware": "knife, fork, spoon, plate, bowl, mug",
    "sit": "chair, sofa, stool, bench, rocking chair",
    "backrest": "chair, sofa, rocking chair",
    "several": "sofa, bench",
    "lie": "bed, sofa, crib, hammock",
    "storage": "toolbox, refrigerator, bookshelf, wardrobe, dresser",
    "drawers": "desk, dresser",
    "rocks": "rocking chair, hammock",
    "worn": "@clothing, helmet, smartwatch",
    "feet": "shoe, boot, sock, sandal",
    "ankle": "boot, sock",
    "head": "hat, helmet",
    "hands": "glove",
    "neck": "scarf, tie",
    "warm": "coat, sweater, glove, scarf",
    "upper": "shirt, dress, coat, sweater, swimsuit, apron",
    "lower": "dress, skirt, swimsuit, apron",
    "women": "dress, skirt",
    "pairs": "shoe, boot, sock, glove, sandal, ski",
    "summer": "sandal, swimsuit",
    "ball": "basketball, soccer ball, volleyball, tennis ball, baseball, golf ball, bowling ball",
    "air": "basketball, soccer ball, volleyball, tennis ball",
    "team": "basketball, soccer ball, volleyball, baseball, baseball bat, hockey stick, helmet",
    "hit": "hammer, tennis racket, baseball bat, golf club, hockey stick",
    "sport": "@sport equipment",
    "garden": "shovel, rake, wheelbarrow, lawn mower",
    "dig": "shovel",
    "cleaning": "vacuum cleaner, washing machine",
    "sweet": "@fruit, -lemon, -avocado, carrot, sweet potato, corn, pea",
    "sour": "lemon",
    "raw": "@fruit, carrot, onion, garlic, broccoli, cauliflower, cabbage, lettuce, cucumber, celery, mushroom, "
           "pea, salmon, tuna, oyster",
    "underground": "carrot, potato, sweet potato, onion, garlic",
    "tree": "apple, banana, orange, mango, lemon, cherry, peach, pear, coconut, avocado",
    "vine": "grape, watermelon, kiwi, cucumber, pumpkin, pea",
    "leaves": "cabbage, lettuce",
    "pit": "mango, cherry, peach, avocado",
    "peel": "banana, orange, watermelon, pineapple, mango, lemon, coconut, kiwi, avocado, onion, garlic, corn, "
            "pumpkin",
    "citrus": "orange, lemon",
    "tropical": "banana, pineapple, mango, coconut, avocado",
    "smell": "onion, garlic",
    "red": "apple, strawberry, cherry, crab, lobster, fire truck",
    "orange": "tiger, starfish, clownfish, orange, carrot, sweet potato, pumpkin, basketball",
    "yellow": "banana, lemon, corn, tennis ball",
    "green": "parrot, peacock, hummingbird, watermelon, pear, avocado, broccoli, cabbage, lettuce, cucumber, "
             "celery, pea",
    "blue": "peacock, blueberry",
    "purple": "eggplant",
    "pink": "pig, flamingo, shrimp",
    "brown": "rabbit, horse, lion, giraffe, bear, monkey, kangaroo, bat, mouse, eagle, owl, turkey, sea turtle, "
             "coconut, kiwi, potato, violin, cello",
    "black": "zebra, penguin, crow, piano, soccer ball",
    "white": "sheep, zebra, penguin, swan, seagull, clownfish, cauliflower, garlic, mushroom, ambulance, "
             "soccer ball, volleyball, baseball, golf ball, washing machine",
    "grey": "elephant, mouse, pigeon, seagull, shark, whale, dolphin, oyster",
}


def expand(spec: str, members: dict[str, list[str]]) -> set[str]:
    """The object names a ``TRUE_FOR`` entry denotes; unknown names are an error."""
    known = {name for names in members.values() for name in names}
    chosen: set[str] = set()
    for item in (part.strip() for part in spec.split(",")):
        if item.startswith("@"):
            chosen |= set(members[item[1:]])
        elif item.startswith("-"):
            if item[1:] not in chosen:
                raise ValueError(f"cannot remove {item[1:]!r}: not chosen yet")
            chosen.remove(item[1:])
        elif item in known:
            chosen.add(item)
        else:
            raise ValueError(f"unknown object {item!r}")
    return chosen


def build() -> dict:
    """The knowledge base as written to JSON."""
    members = {category: [name for name, _ in objects] for category, objects in CATEGORIES.items()}
    ids = [a[0] for a in ATTRIBUTES]
    if sorted(ids) != sorted(TRUE_FOR) or len(set(ids)) != len(ids):
        raise ValueError("every attribute needs exactly one TRUE_FOR entry")
    all_keywords = [k for a in ATTRIBUTES for k in a[3]]
    if len(set(all_keywords)) != len(all_keywords):
        raise ValueError("a keyword must point to one attribute only")
    true_sets = {attr: expand(TRUE_FOR[attr], members) for attr in ids}
    return {
        "about": (
            "Knowledge base of the twenty questions game: yes/no facts about common objects, written for Curio. "
            "Generated by build_twenty_questions.py; every object has an explicit value for every attribute."
        ),
        "prompts": PROMPTS,
        "categories": list(CATEGORIES),
        "attributes": [
            {"id": aid, "question": question, "paraphrases": paraphrases, "keywords": keywords, "note": note}
            for aid, question, paraphrases, keywords, note in ATTRIBUTES
        ],
        "objects": [
            {
                "name": name,
                "category": category,
                "synonyms": synonyms,
                "attributes": {attr: name in true_sets[attr] for attr in ids},
            }
            for category, objects in CATEGORIES.items()
            for name, synonyms in objects
        ],
    }


def render(kb: dict) -> str:
    """Indented JSON, except that each object (with its whole attribute table) sits on one line."""
    head = json.dumps({k: v for k, v in kb.items() if k != "objects"}, indent=1, ensure_ascii=False)
    rows = ",\n".join("  " + json.dumps(obj, ensure_ascii=False) for obj in kb["objects"])
    return head[:-2] + ',\n "objects": [\n' + rows + "\n ]\n}\n"


if __name__ == "__main__":
    knowledge_base = build()
    OUT.write_text(render(knowledge_base), encoding="utf-8")
    print(f"wrote {OUT}: {len(knowledge_base['objects'])} objects, {len(knowledge_base['attributes'])} attributes")
