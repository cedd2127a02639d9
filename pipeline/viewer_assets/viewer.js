const D=JSON.parse(document.getElementById('data').textContent);
const PER=100;const $=s=>document.querySelector(s);
function esc(s){return String(s==null?'':s).replace(/[&<>"']/g,c=>({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;',"'":'&#39;'})[c]);}
function fmt(v){if(v==null)return '';if(typeof v==='number'&&!Number.isInteger(v))return v.toPrecision(4);if(Array.isArray(v))return v.map(fmt).join(', ');return String(v);}
function state(){return new URLSearchParams(location.hash.slice(1));}
function setState(k,v){const s=state();if(v===''||v==null)s.delete(k);else s.set(k,v);if(k!=='row'&&k!=='step'&&k!=='page'){s.delete('row');s.delete('page');s.delete('step');}if(k==='row')s.delete('step');location.hash=s.toString();}
D.rows.forEach((r,i)=>r._i=i);
function matching(){const s=state();return D.rows.filter(r=>D.filters.every(f=>!s.has(f)||String(r[f])===s.get(f)));}
function kv(pairs){return '<table class="kv"><tbody>'+pairs.filter(p=>p[1]!==undefined).map(p=>'<tr><td>'+esc(p[0])+'</td><td>'+esc(fmt(p[1]))+'</td></tr>').join('')+'</tbody></table>';}
function msgs(list,extra){return (list||[]).map((m,i)=>'<div class="msg '+esc(m.role)+'"><span class="role">'+esc(m.role)+'</span>'+(extra?extra(m,i):'')+'<pre>'+esc(m.content)+'</pre></div>').join('');}
function renderFilters(){const s=state();$('#filters').innerHTML=D.filters.map(f=>{const vals=[...new Set(D.rows.map(r=>String(r[f])))].sort();return '<label>'+esc(f)+' <select data-f="'+esc(f)+'"><option value="">all</option>'+vals.map(v=>'<option'+(s.get(f)===v?' selected':'')+'>'+esc(v)+'</option>').join('')+'</select></label>';}).join('')+'<span id="count"></span>';document.querySelectorAll('#filters select').forEach(el=>el.onchange=()=>setState(el.dataset.f,el.value));}
function renderList(){const s=state();const rows=matching();const pages=Math.max(1,Math.ceil(rows.length/PER));const p=Math.min(pages-1,Math.max(0,+(s.get('page')||0)));const sel=s.get('row');
$('#count').textContent=rows.length+' of '+D.rows.length+' shown rows match';
$('#list').innerHTML='<div id="pager">'+(pages>1?'<button id="prev">‹</button>page '+(p+1)+' / '+pages+'<button id="next">›</button>':'')+'</div><table><thead><tr><th>#</th>'+D.columns.map(c=>'<th>'+esc(c)+'</th>').join('')+'</tr></thead><tbody>'+rows.slice(p*PER,(p+1)*PER).map(r=>'<tr data-i="'+r._i+'"'+(String(r._i)===sel?' class="sel"':'')+'><td>'+r._i+'</td>'+D.columns.map(c=>'<td>'+esc(fmt(r[c]))+'</td>').join('')+'</tr>').join('')+'</tbody></table>';
document.querySelectorAll('#list tbody tr').forEach(tr=>tr.onclick=()=>setState('row',tr.dataset.i));
if(pages>1){$('#prev').onclick=()=>setState('page',Math.max(0,p-1));$('#next').onclick=()=>setState('page',Math.min(pages-1,p+1));}}
const R={};
R.episodes=r=>{let ti=0;const acts=r.actions||[];const tr=r.turn_rewards;
return kv([['group',r.group],['task',r.task_id],['category',r.category],['difficulty',r.difficulty],['split',r.split],['policy',r.policy],['sample',r.sample],['outcome',r.outcome],['turns',r.turns],['score (lower is better)',r.score],['reward',r.reward],['format retries',r.format_retries],['final action',r.final_action],['judge verdict',r.judge_label],['secret',r.secret]])
+(r.judge_raw!=null?'<h3>Judge raw reply</h3><pre>'+esc(r.judge_raw)+'</pre>':'')
+'<h3>Transcript</h3>'+msgs(r.conversation,(m,i)=>{if(m.role==='assistant'){const a=acts[i];const rw=tr&&ti<tr.length?'<span class="reward">reward '+fmt(tr[ti])+'</span>':'';ti++;return '<span class="action" title="parsed action">'+(a==null?'no parsable action':'action: '+esc(a))+'</span>'+rw;}if(m.role==='user'&&i>0&&(r.conversation[i-1]||{}).role==='assistant')return ' <span class="role">(environment reply)</span>';return '';});};
R['annotations-text']=r=>kv([['parsed label',r.label],['group',r.group],['task',r.task_id],['policy',r.policy],['claimed outcome',r.outcome],['final action',r.final_action]])
+(r.prompt_sent?'<h3>Prompt sent</h3>'+msgs(r.prompt_sent):'')+'<h3>Raw reply</h3><pre>'+esc(r.judge_raw)+'</pre><h3>Judged trajectory</h3>'+msgs(r.conversation);
R.pairs=r=>kv([['group',r.group],['task',r.task_id],['agent turns before',r.state_turn],['candidates compared',r.candidates],['chosen score',r.chosen_reward],['rejected score',r.rejected_reward],['every candidate\'s score',r.mean_rewards],['ref log-prob chosen',r.ref_chosen_logps],['ref log-prob rejected',r.ref_rejected_logps],['ref margin',r.ref_margin]])
+'<div class="shared"><h3>shared prefix ('+(r.prompt||[]).length+' messages)</h3>'+msgs(r.prompt)+'</div><div class="sides"><div class="chosen"><h3>chosen · score '+esc(fmt(r.chosen_reward))+(r.ref_chosen_logps!=null?' · ref log-prob '+esc(fmt(r.ref_chosen_logps)):'')+'</h3>'+msgs(r.chosen)+'</div><div class="rejected"><h3>rejected · score '+esc(fmt(r.rejected_reward))+(r.ref_rejected_logps!=null?' · ref log-prob '+esc(fmt(r.ref_rejected_logps)):'')+'</h3>'+msgs(r.rejected)+'</div></div>';
R['annotations-nethack']=r=>kv([['parsed label',r.label],['pair',r.pair],['first: episode / step',r.episode_first+' / '+r.step_first],['second: episode / step',r.episode_second+' / '+r.step_second]])
+'<div class="sides"><div><h3>first caption</h3><pre>'+esc(r.caption_first)+'</pre></div><div><h3>second caption</h3><pre>'+esc(r.caption_second)+'</pre></div></div>'
+(r.prompt_sent?'<h3>Prompt sent</h3>'+msgs(r.prompt_sent):'')+'<h3>Raw reply</h3><pre>'+esc(r.raw)+'</pre>';
R['nethack-episodes']=r=>kv(Object.entries(r).filter(e=>e[0]!=='_i'));
function frameAt(fr,k){let b=k-(k%KEYFRAME);while(typeof fr[b]!=='string')b--;const a=fr[b].split('');for(let j=b+1;j<=k;j++){const d=fr[j];if(typeof d==='string'){a.splice(0,a.length,...d.split(''));continue;}for(const [o,t] of d)for(let c=0;c<t.length;c++)a[o+c]=t[c];}const rows=[];for(let y=0;y<a.length;y+=80)rows.push(a.slice(y,y+80).join(''));return rows.join('\n');}
let timer=null;
R['nethack-steps']=r=>{const s=state();const k=Math.min(r.shown-1,Math.max(0,+(s.get('step')||0)));
return kv([['episode',r.episode],['steps',r.steps+(r.shown<r.steps?' (first '+r.shown+' shown)':'')],['return (extrinsic)',r.return]])
+'<div><button id="play">'+(timer?'pause':'play')+'</button> <input id="slider" type="range" min="0" max="'+(r.shown-1)+'" value="'+k+'" style="width:60%"> step <b id="stepno">'+k+'</b></div>'
+kv([['message',r.message[k]||'(none)'],['action',r.action[k]],['extrinsic reward',r.reward[k]],['r̃(message)',r.r_tilde[k]],['intrinsic r̃/N^β',r.intrinsic[k]]])
+(r.frames?'<pre id="screen">'+esc(frameAt(r.frames,k))+'</pre>':'<p class="note">no frames stored</p>')
+'<h3>Steps with a message</h3><table><thead><tr><th>step</th><th>action</th><th>extrinsic</th><th>r̃</th><th>intrinsic</th><th>message</th></tr></thead><tbody>'+r.message.map((m,i)=>m?'<tr data-step="'+i+'"><td>'+i+'</td><td>'+r.action[i]+'</td><td>'+fmt(r.reward[i])+'</td><td>'+fmt(r.r_tilde[i])+'</td><td>'+fmt(r.intrinsic[i])+'</td><td>'+esc(m)+'</td></tr>':'').join('')+'</tbody></table>';};
function wire(r){const sl=$('#slider');if(!sl)return;sl.oninput=()=>setState('step',sl.value);$('#play').onclick=()=>{if(timer){clearInterval(timer);timer=null;render();return;}timer=setInterval(()=>{const k=+(state().get('step')||0);if(k>=r.shown-1){clearInterval(timer);timer=null;render();return;}setState('step',k+1);},120);render();};document.querySelectorAll('#detail tbody tr[data-step]').forEach(tr=>tr.onclick=()=>setState('step',tr.dataset.step));}
function renderDetail(){const s=state();let r=D.rows[+s.get('row')];if(!s.has('row')||!r){const m=matching();r=m[0];}
$('#detail').innerHTML=r?'<h2>row '+r._i+'</h2>'+R[D.kind](r):'<p>No row matches the filters.</p>';if(r&&D.kind==='nethack-steps')wire(r);}
function render(){renderFilters();renderList();renderDetail();}
window.addEventListener('hashchange',render);render();
