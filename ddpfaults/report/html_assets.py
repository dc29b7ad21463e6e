"""The swimlane page's static parts: legend, stylesheet and script (no network, inlined in every page)."""

_LEGEND = """<div class=legend><b>legend</b>
<span><i class='sw step s0'></i>step</span><span><i class='sw coll'></i>collective</span>
<span><i class='sw coll ddp'></i>DDP gradient bucket</span><span><i class='sw coll fsdp'></i>FSDP all-gather / reduce-scatter</span>
<span><i class='sw coll lib'></i>DTensor / DCP</span><span><i class='sw coll open'></i>entered, never left</span>
<span><i class='sw coll ddp noend'></i>seen by the flight recorder only: issued, end not recorded</span>
<span><i class='sw coll divergence'></i>first divergent collective</span><span><i class='sw mkfault'></i>fault fired</span>
<span><b class=x>✕</b>error / death</span><span><i class='sw killed'></i>killed</span><span><i class='sw stall'></i>stall window</span>
<span><i class='sw hang'></i>hang point</span><span><i class='sw verdictsw'></i>verdict</span><span>★ root cause</span></div>"""

_CSS = """
:root{--ok:#1a7f37;--hung:#bc4c00;--late:#6639ba;--crash:#cf222e;--ink:#1f2328;--mut:#656d76;--line:#d0d7de;--coll:#3b6fd4;--ddp:#8250df;--fsdp:#0f8a7e;--lib:#9a6700;--div:#e000a0;
--label:96px;--status:300px;--lane:22px}
*{box-sizing:border-box}
body{margin:0;padding:14px 18px;font:13px/1.4 system-ui,-apple-system,'Segoe UI',Roboto,'DejaVu Sans',sans-serif;color:var(--ink);background:#fff}
h1{font-size:20px;margin:0 0 2px}h2{font-size:16px;margin:0 0 6px}h3{font-size:14px;margin:4px 0}h4{font-size:12px;margin:10px 0 3px;color:var(--mut)}
.muted{color:var(--mut)}pre{margin:0;padding:6px 8px;background:#f6f8fa;border:1px solid var(--line);border-radius:4px;font:11px/1.35 'DejaVu Sans Mono',monospace;white-space:pre-wrap;word-break:break-all;max-height:320px;overflow:auto}
.badge{display:inline-block;white-space:nowrap;padding:0 7px;border-radius:10px;color:#fff;font-weight:600;font-size:12px}
.badge.o-completed{background:var(--ok)}.badge.o-hung{background:var(--hung)}.badge.o-crashed{background:var(--crash)}.badge.o-timed-out{background:var(--late)}
.badge.s-failed{background:var(--crash);letter-spacing:.04em}.badge.s-passed{background:var(--ok)}.badge.s-unchecked{background:#8c959f}
#tally{font-size:14px}.tally-head{font-size:16px}#tally[data-failed]:not([data-failed='0']) .tally-head{color:var(--crash)}
#summary tr.s-failed td{background:#ffebe9}#summary td.expected,#summary td.differed{max-width:360px}
#summary td.differed ul{margin:0;padding-left:16px;color:var(--crash)}#summary td.observed .cause{color:var(--mut)}
#summary{border-collapse:collapse;width:100%;margin:10px 0 8px}
#summary th,#summary td{border-bottom:1px solid var(--line);padding:3px 8px;text-align:left;vertical-align:top}
#summary th{background:#f6f8fa;font-weight:600}#summary td.num{text-align:right;font-variant-numeric:tabular-nums}
#summary td.cause{max-width:640px}#summary td.name{max-width:340px;word-break:break-all}#summary a{color:inherit}
.legend{display:flex;flex-wrap:wrap;gap:4px 14px;align-items:center;margin:6px 0 10px;color:var(--mut);font-size:12px}
.legend span{display:inline-flex;align-items:center;gap:4px}.legend .x{color:var(--crash)}
.sw{display:inline-block;width:18px;height:11px;border-radius:2px;position:relative}
.sw.stall{background:repeating-linear-gradient(135deg,#f5c40055 0 4px,#f5c40022 4px 8px);border:1px solid #d4a600}
.sw.hang{width:3px;background:var(--crash)}.sw.verdictsw{width:3px;background:var(--ink)}.sw.killed{width:3px;background:#000}
.sw.mkfault{width:9px;height:9px;background:#f08c00;transform:rotate(45deg)}
.world{border-top:3px solid var(--line);padding:10px 0 16px;margin-top:8px}
.world.o-hung{border-top-color:var(--hung)}.world.o-crashed{border-top-color:var(--crash)}.world.o-completed{border-top-color:var(--ok)}.world.o-timed-out{border-top-color:var(--late)}
.world.s-failed{border-top:4px solid var(--crash);background:linear-gradient(#ffebe9,#fff 60px)}.world.s-passed{border-top-color:var(--ok)}
dl.facts{display:grid;grid-template-columns:max-content 1fr;gap:1px 10px;margin:0 0 6px}
dl.facts dt{color:var(--mut)}dl.facts dd{margin:0;word-break:break-word}dd.f-root-cause{font-weight:600}
dd.f-differed{color:var(--crash);font-weight:600}dd.f-expected{font-weight:600}
.controls{margin:4px 0;color:var(--mut);font-size:12px}
.controls button{font:inherit;padding:0 7px;margin-left:2px;border:1px solid var(--line);background:#f6f8fa;border-radius:3px;cursor:pointer}
.controls button.on{background:var(--ink);color:#fff;border-color:var(--ink)}
.tl{position:relative;overflow:auto;max-height:72vh;border:1px solid var(--line);border-radius:4px}
.tl.dense{--lane:16px}.tl.compact{--lane:12px}
.tl-inner{position:relative;width:calc(var(--zoom)*100%);min-width:100%}
.tl-row{display:flex;height:var(--lane)}
.tl-label,.tl-status{position:sticky;z-index:4;background:#fff;flex:0 0 auto;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
.tl-label{left:0;width:var(--label);padding:0 6px;border-right:1px solid var(--line)}
.tl-status{right:0;width:var(--status);padding:0 6px;border-left:1px solid var(--line);color:var(--mut)}
.tl-track{position:relative;z-index:0;flex:1 1 auto;overflow:hidden}
.lane{cursor:pointer;font-size:11px;line-height:var(--lane);border-bottom:1px solid #eef0f2}
.tl.compact .lane{font-size:9.5px}.lane:hover .tl-label,.lane:hover .tl-status{background:#f3f6fb}
.lane.selected .tl-label,.lane.selected .tl-status{background:#dde9ff}
.lane.root .tl-label{font-weight:700}.star{color:var(--div);margin-left:3px}
.tl-axis{position:sticky;top:0;z-index:6;height:34px;background:#fff;border-bottom:1px solid var(--line);font-size:11px}
.tl-axis .tl-label,.tl-axis .tl-status{line-height:34px;color:var(--mut);z-index:7}
.tick{position:absolute;top:1px;left:var(--x);padding-left:3px;border-left:1px solid #afb8c1;color:var(--mut);white-space:nowrap;height:15px;line-height:15px}
.tick.l{display:none}.tl.linear .tick.l{display:block}.tl.linear .tick.c{display:none}
.flags{position:absolute;left:0;right:0;top:17px;height:16px}
.flag{position:absolute;left:var(--cl);padding:0 4px;border-left:2px solid;font-size:10.5px;line-height:15px;white-space:nowrap;background:#fff}
.tl.linear .flag{left:var(--ll)}
.hang-flag{border-color:var(--crash);color:var(--crash);font-weight:700}.verdict-flag{border-color:var(--ink);transform:translateX(-100%);border-left:0;border-right:2px solid}
.tl-body{position:relative}
.tl-overlay{position:absolute;top:0;bottom:0;left:var(--label);right:var(--status);pointer-events:none;z-index:3}
.it,.ov{position:absolute;left:var(--cl);width:max(var(--cw),2px)}
.tl.linear .it,.tl.linear .ov{left:var(--ll);width:max(var(--lw),2px)}
.ov{top:0;bottom:0}.ov.vline{width:0}.tl.linear .ov.vline{width:0}
.ov.stall{background:repeating-linear-gradient(135deg,#f5c40030 0 6px,#f5c40014 6px 12px);border-left:1px solid #d4a600;border-right:1px dashed #d4a600}
.ov.judge{background:#f5c40012}
.ov.hang-point{border-left:2px dashed var(--crash)}.ov.verdict{border-left:2px solid var(--ink)}
.it{top:0;bottom:0;overflow:hidden;white-space:nowrap;text-overflow:clip}
.it.life{top:calc(50% - 1px);bottom:auto;height:2px;background:#c5ccd4}
.it.after{top:30%;bottom:30%}.it.after.done{background:repeating-linear-gradient(135deg,#1a7f3733 0 3px,transparent 3px 6px)}
.it.after.failed{background:repeating-linear-gradient(135deg,#cf222e33 0 3px,transparent 3px 6px)}
.it.step{background:#e7ecf3;border-left:1px solid #9aa6b2;color:#57606a;padding-left:3px;font-size:10px;z-index:1}
.it.step.s1{background:#dfe5ee}
.it.coll{top:3px;bottom:3px;background:var(--coll);color:#fff;border-radius:2px;padding-left:2px;font-size:10px;line-height:calc(var(--lane) - 7px);z-index:2;opacity:.9}
.tl.compact .it.coll{top:2px;bottom:2px;font-size:8.5px;line-height:calc(var(--lane) - 5px)}
.it.coll.init{background:#8c959f}.it.coll.ddp{background:var(--ddp)}.it.coll.fsdp{background:var(--fsdp)}.it.coll.lib{background:var(--lib)}
.it.coll.noend{min-width:5px;border-radius:1px;font-size:0}.it.coll.fr{box-shadow:inset 0 0 0 1px #ffffff80}
.it.coll.open{background:repeating-linear-gradient(135deg,#cf222e 0 5px,#ff8182 5px 10px);color:#fff;font-weight:600}
.it.coll.divergence{outline:2px solid var(--div);outline-offset:1px;box-shadow:0 0 0 4px #e000a040;z-index:3;opacity:1}
.sw.coll.noend{width:5px}.sw.coll{background:var(--coll)}.sw.coll.ddp{background:var(--ddp)}.sw.coll.fsdp{background:var(--fsdp)}.sw.coll.lib{background:var(--lib)}.sw.coll.open{background:repeating-linear-gradient(135deg,#cf222e 0 4px,#ff8182 4px 8px)}
.sw.coll.divergence{outline:2px solid var(--div);outline-offset:1px}.sw.step{background:#e7ecf3;border-left:1px solid #9aa6b2}
.mk{position:absolute;left:var(--cl);z-index:5;transform:translateX(-50%)}.tl.linear .mk,.tl.linear .err{left:var(--ll)}
.mk.fault{top:calc(50% - 5px);width:10px;height:10px;background:#f08c00;border:1px solid #fff;transform:translateX(-50%) rotate(45deg)}
.mk.log{top:calc(50% - 3px);width:6px;height:6px;border-radius:50%;background:#57606a}
.mk.killed{top:0;bottom:0;width:3px;background:#000}
.mk.exited{top:calc(50% - 4px);width:8px;height:8px;background:#6e7781}.mk.exited.signal{background:var(--crash)}
.mk.failed{top:0;bottom:0;color:var(--crash);font-weight:900;font-size:15px;line-height:var(--lane)}
.tl.compact .mk.failed{font-size:11px}.mk.failed.collateral{color:#9a6700;font-size:12px}
.mk.divergence-absent{top:1px;bottom:1px;transform:none;margin-left:7px;padding:0 3px;border:2px dashed var(--div);border-radius:3px;color:var(--div);font-weight:700;font-size:10px;line-height:calc(var(--lane) - 6px);white-space:nowrap;background:#fffd}
.err{position:absolute;left:var(--cl);margin-left:9px;z-index:5;color:var(--crash);font-weight:600;white-space:nowrap;background:#ffffffd8;padding:0 3px}
.err.collateral{color:#9a6700;font-weight:400}
.dot{display:inline-block;width:8px;height:8px;border-radius:50%;margin-right:5px;background:#8c959f}
.st{font-weight:600}.dot.st-finished{background:var(--ok)}.dot.st-blocked,.dot.st-running{background:var(--hung)}.dot.st-raised,.dot.st-died{background:var(--crash)}
b.st-finished,span.st-finished{color:var(--ok)}b.st-blocked,b.st-running,span.st-blocked,span.st-running{color:var(--hung)}b.st-raised,b.st-died,span.st-raised,span.st-died{color:var(--crash)}
.detail{margin-top:8px;border:1px solid var(--line);border-radius:4px;padding:6px 10px;background:#fcfcfd}
.rootnote{color:var(--div);font-size:12px}ol.calls{margin:0;padding-left:34px;font:11px/1.4 'DejaVu Sans Mono',monospace}
li.divergent-call{color:var(--div);font-weight:700}
"""

_JS = """
(function(){
  function world(el){return el.closest('section.world');}
  function select(lane){
    var w=world(lane), r=lane.getAttribute('data-rank');
    w.querySelectorAll('.lane.selected').forEach(function(l){l.classList.remove('selected');});
    lane.classList.add('selected');
    w.querySelectorAll('.rank-detail').forEach(function(d){d.hidden=d.getAttribute('data-detail-rank')!==r;});
    var panel=w.querySelector('.detail'); if(panel.scrollIntoView){panel.scrollIntoView({block:'nearest'});}
  }
  document.addEventListener('click',function(ev){
    var lane=ev.target.closest('.lane'); if(lane){select(lane);return;}
    var b=ev.target.closest('button'); if(!b){return;}
    var w=world(b), tl=w.querySelector('.tl');
    if(b.hasAttribute('data-axis')){
      tl.classList.toggle('linear',b.getAttribute('data-axis')==='linear');
      w.querySelectorAll('[data-axis]').forEach(function(x){x.classList.toggle('on',x===b);});
    } else if(b.hasAttribute('data-zoom')){
      var z=parseFloat(tl.style.getPropertyValue('--zoom'))||1, how=b.getAttribute('data-zoom');
      z=how==='in'?Math.min(z*2,64):how==='out'?Math.max(z/2,1):1;
      var centre=(tl.scrollLeft+tl.clientWidth/2)/tl.scrollWidth;
      tl.style.setProperty('--zoom',z); b.parentNode.querySelector('[data-zoom=reset]').textContent=z+'\\u00d7';
      tl.scrollLeft=centre*tl.scrollWidth-tl.clientWidth/2;
    }
  });
  document.addEventListener('keydown',function(ev){
    if(ev.key==='Enter'&&ev.target.classList&&ev.target.classList.contains('lane')){select(ev.target);}
  });
  document.querySelectorAll('section.world').forEach(function(w){
    var d=w.querySelector('.rank-detail:not([hidden])');
    if(d){var l=w.querySelector('.lane[data-rank="'+d.getAttribute('data-detail-rank')+'"]'); if(l){l.classList.add('selected');}}
  });
  document.documentElement.setAttribute('data-ready','1');
})();
"""
