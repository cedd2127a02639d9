// The dataset page's script (pipeline/reporting/viewer.py inlines it, after `const KEYFRAME = …`). The rows are the JSON in
// #data; the filters, the sort column (`sort=col`, `sort=-col` descending), the selected row, the list page and the
// replay step live in location.hash (URLSearchParams syntax), so every view has a link and the page can be driven
// without clicking.
const D = JSON.parse(document.getElementById('data').textContent);
const PER = 100;  // rows per list page
const $ = (s) => document.querySelector(s);
D.rows.forEach((r, i) => { r._i = i; });

function esc(s) {
  return String(s == null ? '' : s).replace(/[&<>"']/g,
    (c) => ({'&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;'})[c]);
}

function fmt(v) {
  if (v == null) return '';
  if (typeof v === 'number' && !Number.isInteger(v)) return v.toPrecision(4);
  if (Array.isArray(v)) return v.map(fmt).join(', ');
  return String(v);
}

function state() { return new URLSearchParams(location.hash.slice(1)); }

// A filter change starts over at the first page with no row selected; a new row starts its replay at step 0.
function setState(key, value) {
  const s = state();
  if (value === '' || value == null) s.delete(key); else s.set(key, value);
  if (!['row', 'step', 'page'].includes(key)) { s.delete('row'); s.delete('page'); s.delete('step'); }
  if (key === 'row') s.delete('step');
  location.hash = s.toString();
}

// Numbers (and booleans) by value, text alphabetically; empty cells last whichever the direction.
function compare(a, b) {
  const empty = (v) => v == null || v === '';
  if (empty(a) || empty(b)) return empty(a) - empty(b);
  if (typeof a === 'boolean') a = +a;
  if (typeof b === 'boolean') b = +b;
  return typeof a === 'number' && typeof b === 'number' ? a - b : String(a).localeCompare(String(b));
}

function matching() {
  const s = state();
  const rows = D.rows.filter((r) => D.filters.every((f) => !s.has(f) || String(r[f]) === s.get(f)));
  const key = s.get('sort');
  if (!key) return rows;
  const col = key.replace(/^-/, '');
  const dir = key.startsWith('-') ? -1 : 1;
  const empty = (v) => v == null || v === '';
  return rows.sort((a, b) => (empty(a[col]) || empty(b[col]) ? compare(a[col], b[col])
    : dir * compare(a[col], b[col])) || a._i - b._i);
}

function kv(pairs) {
  const rows = pairs.filter((p) => p[1] !== undefined)
    .map((p) => '<tr><td>' + esc(p[0]) + '</td><td>' + esc(fmt(p[1])) + '</td></tr>');
  return '<table class="kv"><tbody>' + rows.join('') + '</tbody></table>';
}

function msgs(list, extra) {
  return (list || []).map((m, i) => '<div class="msg ' + esc(m.role) + '"><span class="role">' + esc(m.role)
    + '</span>' + (extra ? extra(m, i) : '') + '<pre>' + esc(m.content) + '</pre></div>').join('');
}

function renderFilters() {
  const s = state();
  $('#filters').innerHTML = D.filters.map((f) => {
    // the fragment's value is listed even when no row has it, so the select never claims 'all' while filtering
    const values = [...new Set(D.rows.map((r) => String(r[f])).concat(s.has(f) ? [s.get(f)] : []))].sort();
    return '<label>' + esc(f) + ' <select data-f="' + esc(f) + '"><option value="">all</option>'
      + values.map((v) => '<option' + (s.get(f) === v ? ' selected' : '') + '>' + esc(v) + '</option>').join('')
      + '</select></label>';
  }).join('') + '<span id="count"></span>';
  document.querySelectorAll('#filters select').forEach((el) => { el.onchange = () => setState(el.dataset.f, el.value); });
}

function renderList() {
  const s = state();
  const rows = matching();
  const pages = Math.max(1, Math.ceil(rows.length / PER));
  const p = Math.min(pages - 1, Math.max(0, +(s.get('page') || 0)));
  const sel = s.get('row');
  $('#count').textContent = rows.length + ' of ' + D.rows.length + ' shown rows match';
  const pager = pages > 1 ? '<button id="prev">‹</button>page ' + (p + 1) + ' / ' + pages + '<button id="next">›</button>' : '';
  const body = rows.slice(p * PER, (p + 1) * PER).map((r) => '<tr data-i="' + r._i + '"'
    + (String(r._i) === sel ? ' class="sel"' : '') + '><td>' + r._i + '</td>'
    + D.columns.map((c) => '<td>' + esc(fmt(r[c])) + '</td>').join('') + '</tr>').join('');
  const sort = s.get('sort') || '';
  const arrow = (c) => (sort === c ? ' ▲' : sort === '-' + c ? ' ▼' : '');
  $('#list').innerHTML = '<div id="pager">' + pager + '</div><table><thead><tr><th>#</th>'
    + D.columns.map((c) => '<th class="sortable" data-c="' + esc(c) + '" title="sort">' + esc(c) + arrow(c) + '</th>')
      .join('') + '</tr></thead><tbody>' + body + '</tbody></table>';
  document.querySelectorAll('#list tbody tr').forEach((tr) => { tr.onclick = () => setState('row', tr.dataset.i); });
  document.querySelectorAll('#list th[data-c]').forEach((th) => {
    th.onclick = () => setState('sort', sort === th.dataset.c ? '-' + th.dataset.c : th.dataset.c);
  });
  if (pages > 1) {
    $('#prev').onclick = () => setState('page', Math.max(0, p - 1));
    $('#next').onclick = () => setState('page', Math.min(pages - 1, p + 1));
  }
}

// -- one renderer per page kind ---------------------------------------------------------------------------------
const R = {};

R.episodes = (r) => {
  let turn = 0;
  const actions = r.actions || [];
  const rewards = r.turn_rewards;
  const marks = (m, i) => {
    if (m.role === 'assistant') {
      const a = actions[i];
      const reward = rewards && turn < rewards.length ? '<span class="reward">reward ' + fmt(rewards[turn]) + '</span>' : '';
      turn++;
      return '<span class="action" title="parsed action">' + (a == null ? 'no parsable action' : 'action: ' + esc(a))
        + '</span>' + reward;
    }
    if (m.role === 'user' && i > 0 && (r.conversation[i - 1] || {}).role === 'assistant') {
      return ' <span class="role">(environment reply)</span>';
    }
    return '';
  };
  return kv([['group', r.group], ['task', r.task_id], ['category', r.category], ['difficulty', r.difficulty],
    ['split', r.split], ['policy', r.policy], ['sample', r.sample], ['outcome', r.outcome], ['turns', r.turns],
    ['score (lower is better)', r.score], ['reward', r.reward], ['format retries', r.format_retries],
    ['final action', r.final_action], ['judge verdict', r.judge_label], ['secret', r.secret]])
    + (r.judge_raw != null ? '<h3>Judge raw reply</h3><pre>' + esc(r.judge_raw) + '</pre>' : '')
    + '<h3>Transcript</h3>' + msgs(r.conversation, marks);
};

// what the row's requests cost (attempts, cache hit, tokens): its share of the stage's LLM ledger
const usage = (r) => [['attempts', r.attempts], ['cached', r.cached === null ? 'no request' : r.cached],
  ['tokens in', r.tokens_in], ['tokens out', r.tokens_out]];

R['annotations-text'] = (r) => kv([['parsed label', r.label], ['group', r.group], ['task', r.task_id],
  ['policy', r.policy], ['claimed outcome', r.outcome], ['final action', r.final_action], ...usage(r)])
  + (r.prompt_sent ? '<h3>Prompt sent</h3>' + msgs(r.prompt_sent) : '')
  + '<h3>Raw reply</h3><pre>' + esc(r.judge_raw) + '</pre><h3>Judged trajectory</h3>' + msgs(r.conversation);

R.pairs = (r) => {
  // multi-turn pairs: a candidate turn's mean reward; PAPRIKA pairs: the turns a whole trajectory used
  const side = (name, score, turns, logp, policyLogp, messages) => '<div class="' + name + '"><h3>' + name
    + (score != null ? ' · score ' + esc(fmt(score)) : '') + (turns != null ? ' · ' + esc(turns) + ' turns' : '')
    + (logp != null ? ' · ref log-prob ' + esc(fmt(logp)) : '')
    + (policyLogp != null ? ' · trained log-prob ' + esc(fmt(policyLogp)) : '') + '</h3>' + msgs(messages) + '</div>';
  return kv([['group', r.group], ['task', r.task_id], ['agent turns before', r.state_turn],
    ['candidates compared', r.candidates], ['chosen score', r.chosen_reward], ['rejected score', r.rejected_reward],
    ["every candidate's score", r.mean_rewards], ['chosen turns', r.chosen_turns], ['rejected turns', r.rejected_turns],
    ['rejected succeeded', r.rejected_success], ['ref log-prob chosen', r.ref_chosen_logps],
    ['ref log-prob rejected', r.ref_rejected_logps], ['ref margin', r.ref_margin],
    ['trained policy log-prob chosen', r.policy_chosen_logps], ['trained policy log-prob rejected', r.policy_rejected_logps],
    ['implicit reward margin', r.implicit_margin], ['implicit reward prefers chosen', r.prefers_chosen]])
    // a long shared prefix starts folded, so chosen and rejected are in view
    + '<details class="shared"' + ((r.prompt || []).length <= 4 ? ' open' : '') + '><summary>shared prefix ('
    + (r.prompt || []).length + ' messages)</summary>' + msgs(r.prompt) + '</details>'
    + '<div class="sides">'
    + side('chosen', r.chosen_reward, r.chosen_turns, r.ref_chosen_logps, r.policy_chosen_logps, r.chosen)
    + side('rejected', r.rejected_reward, r.rejected_turns, r.ref_rejected_logps, r.policy_rejected_logps, r.rejected)
    + '</div>';
};

R['annotations-utterances'] = (r) => kv([['parsed label', r.label], ['pair', r.pair], ['group', r.group],
  ['task', r.task_id], ['agent turn', r.turn], ['first: play', r.sample_first], ['second: play', r.sample_second],
  ...usage(r)])
  + '<div class="sides"><div><h3>first move</h3><pre>' + esc(r.text_first) + '</pre></div>'
  + '<div><h3>second move</h3><pre>' + esc(r.text_second) + '</pre></div></div>'
  + '<h3>Raw reply</h3><pre>' + esc(r.raw) + '</pre>';

R['annotations-nethack'] = (r) => kv([['parsed label', r.label], ['pair', r.pair],
  ['first: episode / step', r.episode_first + ' / ' + r.step_first],
  ['second: episode / step', r.episode_second + ' / ' + r.step_second], ...usage(r)])
  + '<div class="sides"><div><h3>first caption</h3><pre>' + esc(r.caption_first) + '</pre></div>'
  + '<div><h3>second caption</h3><pre>' + esc(r.caption_second) + '</pre></div></div>'
  + (r.prompt_sent ? '<h3>Prompt sent</h3>' + msgs(r.prompt_sent) : '')
  + '<h3>Raw reply</h3><pre>' + esc(r.raw) + '</pre>';

R['nethack-episodes'] = (r) => kv(Object.entries(r).filter((e) => !['_i', 'replay'].includes(e[0])))
  + (r.replay ? '<h3>Replay</h3>' + replay(r.replay)
    : '<p class="note">evaluate-nethack kept no steps of this episode (filter replayed = yes).</p>');

// Frame k: the last full frame at or before k, then the changed runs ([offset, text]) of the steps after it.
function frameAt(frames, k) {
  let b = k - (k % KEYFRAME);
  while (typeof frames[b] !== 'string') b--;
  const cells = frames[b].split('');
  for (let j = b + 1; j <= k; j++) {
    const d = frames[j];
    if (typeof d === 'string') { cells.splice(0, cells.length, ...d.split('')); continue; }
    for (const [offset, text] of d) for (let c = 0; c < text.length; c++) cells[offset + c] = text[c];
  }
  const lines = [];
  for (let y = 0; y < cells.length; y += 80) lines.push(cells.slice(y, y + 80).join(''));
  return lines.join('\n');
}

let timer = null;
function replay(r) {
  const k = Math.min(r.shown - 1, Math.max(0, +(state().get('step') || 0)));
  const steps = r.message.map((m, i) => m ? '<tr data-step="' + i + '"><td>' + i + '</td><td>' + r.action[i] + '</td><td>'
    + fmt(r.reward[i]) + '</td><td>' + fmt(r.r_tilde[i]) + '</td><td>' + fmt(r.intrinsic[i]) + '</td><td>' + esc(m)
    + '</td></tr>' : '').join('');
  return kv([['episode', r.episode], ['steps', r.steps + (r.shown < r.steps ? ' (first ' + r.shown + ' shown)' : '')],
    ['return (extrinsic)', r.return]])
    + '<div><button id="play">' + (timer ? 'pause' : 'play') + '</button> <input id="slider" type="range" min="0" max="'
    + (r.shown - 1) + '" value="' + k + '" style="width:60%"> step <b id="stepno">' + k + '</b> (← → keys)</div>'
    + kv([['message', r.message[k] || '(none)'], ['action', r.action[k]], ['extrinsic reward', r.reward[k]],
      ['r̃(message)', r.r_tilde[k]], ['intrinsic r̃/N^β', r.intrinsic[k]]])
    + (r.frames ? '<pre id="screen">' + esc(frameAt(r.frames, k)) + '</pre>' : '<p class="note">no frames stored</p>')
    + '<h3>Steps with a message</h3><table><thead><tr><th>step</th><th>action</th><th>extrinsic</th><th>r̃</th>'
    + '<th>intrinsic</th><th>message</th></tr></thead><tbody>' + steps + '</tbody></table>';
}
R['nethack-steps'] = replay;

function stop() { clearInterval(timer); timer = null; }

function wireReplay(r) {
  const slider = $('#slider');
  if (!slider) return;
  slider.oninput = () => setState('step', slider.value);
  $('#play').onclick = () => {
    if (timer) { stop(); render(); return; }
    timer = setInterval(() => {
      const k = +(state().get('step') || 0);
      if (k >= r.shown - 1) { stop(); render(); return; }
      setState('step', k + 1);
    }, 120);
    render();
  };
  document.querySelectorAll('#detail tbody tr[data-step]').forEach((tr) => { tr.onclick = () => setState('step', tr.dataset.step); });
  document.onkeydown = (e) => {
    if (e.target.tagName === 'SELECT' || !['ArrowLeft', 'ArrowRight'].includes(e.key)) return;
    const k = +(state().get('step') || 0) + (e.key === 'ArrowRight' ? 1 : -1);
    setState('step', Math.min(r.shown - 1, Math.max(0, k)));
    e.preventDefault();
  };
}

function renderDetail() {
  const s = state();
  let r = s.has('row') ? D.rows[+s.get('row')] : undefined;
  if (!r) r = matching()[0];
  $('#detail').innerHTML = r ? '<h2>row ' + r._i + '</h2>' + R[D.kind](r) : '<p>No row matches the filters.</p>';
  if (r && D.kind === 'nethack-steps') wireReplay(r);
  if (r && D.kind === 'nethack-episodes' && r.replay) wireReplay(r.replay);
}

function render() { renderFilters(); renderList(); renderDetail(); }

window.addEventListener('hashchange', render);
render();
