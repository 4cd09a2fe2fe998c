"""The report page's inline CSS and scripts (no network resources: the page opens from disk).

``ERRORS_JS`` runs first and records script errors on ``<html data-errors>``; ``JS`` draws the
lazy views and sets ``<html data-ready="1">`` when it has run to its end.  Opening the page with
``#fx-selftest`` exercises every view (tabs, hovers, zoom, the node window, each kind of
collapsible source) and sets ``data-selftest`` to what it checked, with the hover text it saw
over each graph's first buffer: the browser test uses it.
"""

CSS = r"""
:root{--fg:#1c2024;--mut:#60646c;--line:#d9d9e0;--bg:#fff;--soft:#f6f6f8;--acc:#2563eb;--bad:#e5484d}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);background:var(--bg);margin:0 auto;padding:12px 24px 60px;max-width:1500px}
h1{font-size:20px;margin:6px 0}h2{font-size:17px;margin:26px 0 6px;border-bottom:1px solid var(--line);padding-bottom:3px}
h3{font-size:14px;margin:14px 0 4px}small{color:var(--mut);font-weight:normal}
code,pre{font:12px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
pre{background:var(--soft);padding:8px 10px;overflow:auto;max-height:640px;border:1px solid var(--line);border-radius:4px;margin:4px 0}
.note{color:var(--mut);margin:4px 0}.summary{margin:6px 0;font-size:15px}.warn{color:var(--bad);font-weight:600}
nav.toc a{margin-right:12px;color:var(--acc);text-decoration:none}
nav.tabs{margin:6px 0}nav.tabs button{font:inherit;padding:4px 14px;margin-right:4px;border:1px solid var(--line);background:var(--soft);border-radius:4px 4px 0 0;cursor:pointer}
nav.tabs button.on{background:var(--acc);color:#fff;border-color:var(--acc)}
table{border-collapse:collapse;margin:6px 0;width:100%}
th,td{border-bottom:1px solid var(--line);padding:3px 8px;text-align:left;vertical-align:top}
th{background:var(--soft);font-weight:600}
table.clickable tbody tr{cursor:pointer}table.clickable tbody tr:hover,tr.on{background:#e8f0fe}
table.stats td:first-child,table.kernels td:first-child{font-family:ui-monospace,monospace}
details summary{cursor:pointer;color:var(--acc)}
svg{display:block;width:100%;height:auto;overflow:visible;user-select:none}
svg.mem{border:1px solid var(--line);background:#fcfcfd}
svg .grid{stroke:#ececf0;stroke-width:1;vector-effect:non-scaling-stroke}
svg text{font:9px system-ui,sans-serif;fill:var(--mut)}
svg .tick{text-anchor:end}svg .xticks text{text-anchor:middle}
svg .arena{fill:#e4e6ee;stroke:#8b8fa0;stroke-width:1;vector-effect:non-scaling-stroke}
svg .buf{stroke:rgba(0,0,0,.25);stroke-width:.5;vector-effect:non-scaling-stroke}
svg .buf.reuse{stroke:#111;stroke-dasharray:3 2;stroke-width:1}
svg .buf.slice{stroke:#3b0764;stroke-width:1.5}svg .buf.symmetric{stroke:#134e4a;stroke-width:1.5}
svg .buf.on{stroke:#000;stroke-width:2}
svg .lb{stroke:#111;stroke-dasharray:6 4;stroke-width:1.2;vector-effect:non-scaling-stroke}
svg .ab{stroke:#e5484d;stroke-width:1.2;vector-effect:non-scaling-stroke}
svg .lb-t,svg .ab-t{font-size:10px}svg .lb-t{fill:#111}svg .ab-t{fill:#e5484d}
svg .curve{fill:none;stroke-width:1.6;vector-effect:non-scaling-stroke}
svg .curve.eager{stroke:#c4a2e8;stroke-width:4}svg .curve.schedule{stroke:#12a594}svg .curve.arenas{stroke:#f76b15;stroke-dasharray:4 3}
svg .cursor{stroke:#111;stroke-width:1;vector-effect:non-scaling-stroke}
svg .brush{fill:rgba(37,99,235,.12);stroke:var(--acc);stroke-width:1}
.legend{color:var(--mut);font-size:12px;margin:4px 0}.legend .hint{margin-left:18px;font-style:italic}
.sw{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px;vertical-align:-2px;border:1px solid rgba(0,0,0,.2)}
.sw.reuse{border:1px dashed #111;background:#fff}
.ln{display:inline-block;width:22px;height:0;margin:0 4px 0 14px;vertical-align:3px;border-top:2px solid}
.ln.eager{border-color:#c4a2e8;border-top-width:4px}.ln.schedule{border-color:#12a594}.ln.arenas{border-color:#f76b15;border-top-style:dashed}
svg.overview{height:34px;border:1px solid var(--line);cursor:pointer}
svg .grp{stroke:#fff;stroke-width:.4;vector-effect:non-scaling-stroke}svg .grp.sel{stroke:#000;stroke-width:2}
.controls{margin:8px 0;display:flex;gap:8px;align-items:center}.controls .slider{flex:1}.controls .range{color:var(--mut);font-size:12px}
.detail{overflow:auto;max-height:720px;border:1px solid var(--line);background:#fcfcfd}
.detail svg{width:auto}
.detail .node rect{stroke:#888;stroke-width:1}.detail .node.view rect,.detail .node.in rect,.detail .node.attr rect,.detail .node.item rect{stroke-dasharray:3 2;fill:#f1f1f4}
.detail .node.fb rect{fill:#ffdbdc;stroke:#e5484d;stroke-width:2.5}
.detail .node.hl rect{stroke:#2563eb;stroke-width:3}
.detail .node text{font-size:10px;fill:#1c2024}.detail .node text.op{fill:#60646c}
.detail .edge{fill:none;stroke:#a0a4ad;stroke-width:1}
svg.timeline .tl{fill:#2563eb}svg.timeline .tl.stage{fill:#12a594}
svg.timeline .tl-label{text-anchor:end;font-size:10px;fill:#1c2024}svg.timeline .tl-time,svg.timeline .tl-total{font-size:10px}
pre.diff .add{color:#18794e;background:#e9f9ee;display:block}pre.diff .del{color:#ce2c31;background:#fff0f0;display:block}pre.diff .hunk{color:#8e4ec6;display:block}
.tip{position:fixed;z-index:10;pointer-events:none;background:#1c2024;color:#fff;font:12px/1.4 ui-monospace,monospace;padding:6px 8px;border-radius:4px;max-width:560px;white-space:pre-wrap;box-shadow:0 2px 8px rgba(0,0,0,.25)}
"""

ERRORS_JS = r"""
(function(){
  var errs=[];
  function note(m){errs.push(String(m));document.documentElement.setAttribute("data-errors",errs.join(" | "));}
  window.addEventListener("error",function(e){note(e.message||e.type);});
  window.addEventListener("unhandledrejection",function(e){note("unhandled rejection: "+(e.reason&&e.reason.message||e.reason));});
  var ce=console.error;console.error=function(){note(Array.prototype.join.call(arguments," "));return ce.apply(console,arguments);};
})();
"""

JS = r"""
(function(){
"use strict";
var SVGNS=document.querySelector("svg").namespaceURI, W=1000, WIN=60, ROW=6;
var tip=document.querySelector(".tip");

function fmtB(n){
  var u=["B","KiB","MiB","GiB"],i=0;n=+n;
  while(Math.abs(n)>=1024&&i<3){n/=1024;i++;}
  return i?n.toFixed(2).replace(/\.?0+$/,"")+" "+u[i]:n.toLocaleString()+" B";
}
function showTip(ev,lines){
  tip.textContent="";
  lines.forEach(function(l){var d=document.createElement("div");d.textContent=l;tip.appendChild(d);});
  tip.hidden=false;
  var x=ev.clientX+14,y=ev.clientY+14,r=tip.getBoundingClientRect();
  if(x+r.width>window.innerWidth)x=Math.max(0,ev.clientX-r.width-14);
  if(y+r.height>window.innerHeight)y=Math.max(0,ev.clientY-r.height-14);
  tip.style.left=x+"px";tip.style.top=y+"px";
}
function hideTip(){tip.hidden=true;}
function el(tag,attrs,parent){
  var e=document.createElementNS(SVGNS,tag);
  for(var k in attrs)if(Object.prototype.hasOwnProperty.call(attrs,k))e.setAttribute(k,attrs[k]);
  if(parent)parent.appendChild(e);
  return e;
}
function svgX(svg,ev){
  var m=svg.getScreenCTM();if(!m)return null;
  var p=svg.createSVGPoint();p.x=ev.clientX;p.y=ev.clientY;
  return p.matrixTransform(m.inverse()).x;
}
function niceStep(raw){
  var mag=Math.pow(10,Math.floor(Math.log10(Math.max(raw,1e-9)))),c=[1,2,2.5,5,10];
  for(var i=0;i<c.length;i++)if(c[i]*mag>=raw)return Math.max(1,c[i]*mag);
  return 10*mag;
}

/* ---------------------------------------------------------------- memory: zoom, hover */
function Zoom(svgs){this.svgs=svgs.filter(Boolean);this.a=0;this.b=W;this.apply();}
Zoom.prototype.apply=function(){
  var k=W/(this.b-this.a),a=this.a,b=this.b;
  this.svgs.forEach(function(s){
    s.querySelector("g.plot").setAttribute("transform","translate("+(-a*k)+",0) scale("+k+",1)");
    var g=s.querySelector("g.xticks"),steps=+s.getAttribute("data-steps")||1;
    while(g.firstChild)g.removeChild(g.firstChild);
    var s0=a/W*steps,s1=b/W*steps,st=niceStep((s1-s0)/8);
    for(var v=Math.ceil(s0/st)*st;v<=s1;v+=st){
      var t=el("text",{x:((v/steps*W)-a)*k,y:0},g);t.textContent=String(Math.round(v));
    }
  });
};
Zoom.prototype.toData=function(x){return this.a+x/W*(this.b-this.a);};
Zoom.prototype.set=function(x0,x1){
  var lo=this.toData(Math.max(0,Math.min(x0,x1))),hi=this.toData(Math.min(W,Math.max(x0,x1)));
  if(hi-lo<0.5)return;this.a=lo;this.b=hi;this.apply();
};
Zoom.prototype.reset=function(){this.a=0;this.b=W;this.apply();};
function brush(svg,zoom){
  var x0=null,r=null;
  svg.addEventListener("mousedown",function(ev){
    if(ev.button!==0)return;var x=svgX(svg,ev);if(x===null||x<0||x>W)return;
    x0=x;r=el("rect",{"class":"brush",x:x,y:-10,width:0,height:svg.viewBox.baseVal.height},svg);ev.preventDefault();
  });
  window.addEventListener("mousemove",function(ev){
    if(x0===null)return;var x=svgX(svg,ev);if(x===null)return;
    r.setAttribute("x",Math.min(x,x0));r.setAttribute("width",Math.abs(x-x0));
  });
  window.addEventListener("mouseup",function(ev){
    if(x0===null)return;var x=svgX(svg,ev);if(r&&r.parentNode)r.parentNode.removeChild(r);
    if(x!==null&&Math.abs(x-x0)>4)zoom.set(x0,x);x0=null;r=null;
  });
  svg.addEventListener("dblclick",function(){zoom.reset();});
}
function setupMemory(st){
  var sec=st.sec,d=st.data;if(!d.buffers)return;
  var ar=sec.querySelector("svg.arenas-svg"),fr=sec.querySelector("svg.fresh-svg"),cu=sec.querySelector("svg.curves-svg");
  st.memZoom=new Zoom([ar,fr]);st.curveZoom=new Zoom([cu]);
  [ar,fr].forEach(function(svg){
    if(!svg)return;brush(svg,st.memZoom);
    svg.addEventListener("mouseover",function(ev){
      var t=ev.target,i=t.getAttribute&&t.getAttribute("data-i"),a=t.getAttribute&&t.getAttribute("data-a");
      if(i!==null&&i!==undefined&&i!==""){
        t.classList.add("on");showTip(ev,d.tips[+i]);
      }else if(a!==null&&a!==undefined&&a!==""){
        var A=d.arenas[+a];showTip(ev,[A[0]+" on "+A[1],"size: "+fmtB(A[2]),"live: steps "+A[3]+".."+A[4],"planner: "+A[5]]);
      }
    });
    svg.addEventListener("mouseout",function(ev){if(ev.target.classList)ev.target.classList.remove("on");hideTip();});
    svg.addEventListener("click",function(ev){
      var i=ev.target.getAttribute&&ev.target.getAttribute("data-i");
      if(i!==null&&i!==undefined&&i!==""&&st.byName){var n=st.byName[d.buffers[+i][3]];if(n!==undefined)focusNodes(st,[n],true);}
    });
  });
  if(cu){
    brush(cu,st.curveZoom);
    var c=d.curves,steps=+cu.getAttribute("data-steps")||1,cur=cu.querySelector(".cursor");
    cu.addEventListener("mousemove",function(ev){
      var x=svgX(cu,ev);if(x===null||x<0||x>W){hideTip();return;}
      var s=Math.floor(st.curveZoom.toData(x)/W*steps),lines=["step "+s];
      cur.setAttribute("x1",(s+0.5)*W/steps);cur.setAttribute("x2",(s+0.5)*W/steps);
      if(c.eager&&s<c.eager.length)lines.push("eager:    "+fmtB(c.eager[s])+"  at "+c.eager_names[s]);
      if(s<c.schedule.length)lines.push("schedule: "+fmtB(c.schedule[s])+"  at "+c.schedule_names[s]);
      if(s<c.arenas.length)lines.push("arenas:   "+fmtB(c.arenas[s]));
      showTip(ev,lines);
    });
    cu.addEventListener("mouseleave",hideTip);
  }
}

/* ---------------------------------------------------------------- graph: overview + node window */
function setupGraph(st){
  var sec=st.sec,d=st.data;if(!d.nodes)return;
  st.byName={};d.nodes.forEach(function(n,i){st.byName[n[0]]=i;});
  /* the node window skips inputs and attributes (a node shows how many inputs come from outside it) */
  st.vis=[];st.visPos=[];
  d.nodes.forEach(function(n,i){st.visPos[i]=st.vis.length;if(n[2]!=="in"&&n[2]!=="attr")st.vis.push(i);});
  if(!st.vis.length)st.vis=d.nodes.map(function(n,i){st.visPos[i]=i;return i;});
  st.hl={};st.start=0;st.detail=sec.querySelector(".detail");st.slider=sec.querySelector(".slider");
  st.slider.max=Math.max(0,st.vis.length-WIN);
  st.range=sec.querySelector(".range");st.overview=sec.querySelector("svg.overview");
  sec.querySelector(".prev").addEventListener("click",function(){showWindow(st,st.start-WIN);});
  sec.querySelector(".next").addEventListener("click",function(){showWindow(st,st.start+WIN);});
  st.slider.addEventListener("input",function(){showWindow(st,+st.slider.value);});
  sec.querySelector(".find").addEventListener("change",function(ev){
    var q=ev.target.value.trim(),hit=[];
    d.nodes.forEach(function(n,i){if(q&&n[0].indexOf(q)>=0)hit.push(i);});
    if(hit.length)focusNodes(st,hit.slice(0,50),false);
  });
  st.overview.addEventListener("click",function(ev){
    var g=ev.target.getAttribute("data-g");if(g!==null)focusNodes(st,d.groups[+g][3],false);
  });
  st.overview.addEventListener("mouseover",function(ev){
    var g=ev.target.getAttribute("data-g");if(g===null)return;var G=d.groups[+g];
    var names=G[3].slice(0,6).map(function(i){return d.nodes[i][0]+" = "+d.nodes[i][1];});
    if(G[3].length>6)names.push("... "+(G[3].length-6)+" more");
    showTip(ev,["group "+G[0]+(G[2]?"  "+G[2]:"")+"  ("+G[1]+(G[4]?", fallback":"")+")"].concat(names));
  });
  st.overview.addEventListener("mouseout",hideTip);
  var rt=sec.querySelector("table.refused");
  if(rt)rt.addEventListener("click",function(ev){
    var tr=ev.target.closest("tr[data-r]");if(!tr)return;
    var r=d.refused[+tr.getAttribute("data-r")],hit=[];
    r.forEach(function(name){
      var i=st.byName[name];if(i===undefined)return;
      var g=d.nodes[i][3];if(g>=0)hit=hit.concat(d.groups[g][3]);else hit.push(i);
    });
    rt.querySelectorAll("tr.on").forEach(function(x){x.classList.remove("on");});tr.classList.add("on");
    if(hit.length)focusNodes(st,hit,true);
  });
  var ft=sec.querySelector("table.fallbacks");
  if(ft)ft.addEventListener("click",function(ev){
    var tr=ev.target.closest("tr[data-node]");if(!tr)return;var i=st.byName[tr.getAttribute("data-node")];
    if(i!==undefined)focusNodes(st,[i],true);
  });
  showWindow(st,0);
}
function focusNodes(st,idxs,scroll){
  st.hl={};idxs.forEach(function(i){st.hl[i]=1;});
  var groups={};idxs.forEach(function(i){var g=st.data.nodes[i][3];if(g>=0)groups[g]=1;});
  st.overview.querySelectorAll("rect.grp").forEach(function(r){r.classList.toggle("sel",!!groups[r.getAttribute("data-g")]);});
  showWindow(st,Math.min.apply(null,idxs.map(function(i){return st.visPos[i];}))-8);
  if(scroll)st.detail.scrollIntoView({block:"center"});
}
function showWindow(st,start){
  var n=st.vis.length;start=Math.max(0,Math.min(start,n-WIN));start=Math.max(0,start);
  st.start=start;st.slider.value=start;
  st.range.textContent="nodes "+start+"\u2013"+(Math.min(n,start+WIN)-1)+" of "+n+" (inputs not shown)";
  drawDetail(st);
}
function drawDetail(st){
  var d=st.data,win=st.vis.slice(st.start,st.start+WIN),inWin={},layer={},rows=[],i,j,w;
  win.forEach(function(i){inWin[i]=1;});
  for(w=0;w<win.length;w++){
    i=win[w];var l=0,ins=d.nodes[i][4];
    for(j=0;j<ins.length;j++)if(inWin[ins[j]]&&ins[j]<i)l=Math.max(l,layer[ins[j]]+1);
    layer[i]=l;(rows[l]=rows[l]||[]).push(i);
  }
  var lines=[];rows.forEach(function(r){if(!r)return;for(var k=0;k<r.length;k+=ROW)lines.push(r.slice(k,k+ROW));});
  var BW=168,BH=34,GX=18,GY=30,wide=0,pos={};
  lines.forEach(function(r){wide=Math.max(wide,r.length);});
  var width=Math.max(1,wide)*(BW+GX)+GX,height=lines.length*(BH+GY)+GY;
  var svg=el("svg",{width:width,height:height,viewBox:"0 0 "+width+" "+height});
  var edges=el("g",{},svg),boxes=el("g",{},svg);
  lines.forEach(function(r,y){
    var off=(width-r.length*(BW+GX)+GX)/2;
    r.forEach(function(i,k){pos[i]=[off+k*(BW+GX),GY/2+y*(BH+GY)];});
  });
  for(w=0;w<win.length;w++){
    i=win[w];var n=d.nodes[i],p=pos[i],ext=0;
    n[4].forEach(function(j){
      if(pos[j]){var q=pos[j],x1=q[0]+BW/2,y1=q[1]+BH,x2=p[0]+BW/2,y2=p[1],m=(y1+y2)/2;
        el("path",{"class":"edge",d:"M"+x1+" "+y1+"C"+x1+" "+m+" "+x2+" "+m+" "+x2+" "+y2},edges);}
      else ext++;
    });
    var g=n[3],cls="node "+n[2]+(n[5]>=0?" fb":"")+(st.hl[i]?" hl":"");
    var box=el("g",{"class":cls,transform:"translate("+p[0]+","+p[1]+")","data-n":i},boxes);
    var fill=g>=0?"hsl("+d.groups[g][5]+",55%,82%)":"#f1f1f4";
    el("rect",{width:BW,height:BH,rx:4,fill:fill},box);
    var t1=el("text",{x:6,y:14},box);t1.textContent=(n[5]>=0?"\u26a0 ":"")+clip(n[0],26);
    var t2=el("text",{"class":"op",x:6,y:27},box);t2.textContent=clip(n[1],24)+(ext?"  \u2191"+ext:"");
  }
  svg.addEventListener("mouseover",function(ev){
    var b=ev.target.closest&&ev.target.closest("g.node");if(!b)return;
    var k=+b.getAttribute("data-n"),n=d.nodes[k],G=n[3]>=0?d.groups[n[3]]:null;
    var lines2=[n[0]+" = "+n[1],"kind: "+n[2]+"   schedule position "+k];
    if(G)lines2.push("group "+G[0]+" ("+G[1]+(G[2]?", "+G[2]:"")+", "+G[3].length+" nodes)");
    if(n[5]>=0)lines2.push("fallback: "+d.reasons[n[5]]);
    if(n[4].length)lines2.push("inputs: "+n[4].map(function(j){return d.nodes[j][0];}).join(", "));
    showTip(ev,lines2);
  });
  svg.addEventListener("mouseout",hideTip);
  st.detail.textContent="";st.detail.appendChild(svg);
}
function clip(s,n){s=String(s);return s.length>n?s.slice(0,n-1)+"\u2026":s;}

/* ---------------------------------------------------------------- collapsible sources, drawn on open */
function setupLazy(st){
  var d=st.data;
  st.sec.addEventListener("toggle",function(ev){
    var det=ev.target;if(!det.open||det.getAttribute("data-done"))return;
    var pre=det.querySelector(":scope > pre");if(!pre)return;det.setAttribute("data-done","1");
    if(det.classList.contains("code")){
      (d.diffs[+det.getAttribute("data-pass")]||"(no change in the code: the pass changed metadata only)").split("\n").forEach(function(l){
        var s=document.createElement("span");s.textContent=l+"\n";
        s.className=l.charAt(0)==="+"&&l.slice(0,3)!=="+++"?"add":l.charAt(0)==="-"&&l.slice(0,3)!=="---"?"del":l.slice(0,2)==="@@"?"hunk":"";
        pre.appendChild(s);
      });
    }else if(det.classList.contains("full")){pre.textContent=d.texts[+det.getAttribute("data-text")]||"(empty)";}
    else if(det.classList.contains("ksrc")){var k=d.kernels[+det.getAttribute("data-k")];pre.textContent=k[0]+(k[1]?"\n\n# device code\n"+k[1]:"");}
  },true);
}

/* ---------------------------------------------------------------- tabs, start-up */
function init(sec){
  if(sec.fxState)return sec.fxState;
  var st={sec:sec,data:JSON.parse(sec.querySelector("script.data").textContent)};
  sec.fxState=st;
  setupGraph(st);setupMemory(st);setupLazy(st);
  return st;
}
var sections=Array.prototype.slice.call(document.querySelectorAll("section.graph"));
document.querySelectorAll("nav.tabs button").forEach(function(b){
  b.addEventListener("click",function(){
    var t=+b.getAttribute("data-tab");
    document.querySelectorAll("nav.tabs button").forEach(function(x){x.classList.toggle("on",x===b);});
    sections.forEach(function(s){s.hidden=+s.getAttribute("data-g")!==t;});
    init(sections[t]);
  });
});
if(sections.length)init(sections[0]);
document.documentElement.setAttribute("data-ready","1");

/* ---------------------------------------------------------------- self-test (#fx-selftest) */
function fire(target,type,x,y){
  target.dispatchEvent(new MouseEvent(type,{bubbles:true,cancelable:true,clientX:x,clientY:y,view:window}));
}
function selfTest(){
  var report={graphs:0,buffers:0,nodes:0,opened:0,tips:[]};
  document.querySelectorAll("nav.tabs button").forEach(function(b){fire(b,"click",0,0);});
  sections.forEach(function(sec){
    sec.hidden=false;var st=init(sec);report.graphs++;
    var r=sec.querySelector("rect.buf");
    if(r){var bb=r.getBoundingClientRect();fire(r,"mouseover",bb.left+1,bb.top+1);
      report.tips.push({i:+r.getAttribute("data-i"),lines:Array.prototype.map.call(tip.children,function(c){return c.textContent;})});
      fire(r,"click",bb.left+1,bb.top+1);report.buffers++;}
    var cu=sec.querySelector("svg.curves-svg");
    if(cu){var cb=cu.getBoundingClientRect();fire(cu,"mousemove",cb.left+cb.width/2,cb.top+cb.height/2);}
    var ar=sec.querySelector("svg.arenas-svg");
    if(ar){var ab=ar.getBoundingClientRect();fire(ar,"mousedown",ab.left+ab.width*0.3,ab.top+20);
      fire(window,"mousemove",ab.left+ab.width*0.6,ab.top+20);fire(window,"mouseup",ab.left+ab.width*0.6,ab.top+20);fire(ar,"dblclick",ab.left+5,ab.top+5);}
    var g=sec.querySelector("rect.grp");if(g)fire(g,"click",0,0);
    var rr=sec.querySelector("table.refused tr[data-r]");if(rr)fire(rr,"click",0,0);
    if(st.slider)showWindow(st,Math.floor(st.data.nodes.length/2));
    report.nodes+=sec.querySelectorAll(".detail g.node").length;
    sec.querySelectorAll("details").forEach(function(det){det.open=true;report.opened++;});
  });
  hideTip();
  setTimeout(function(){
    var empty=0;
    document.querySelectorAll("details[open] > pre").forEach(function(p){if(!p.textContent)empty++;});
    report.emptyPre=empty;
    document.documentElement.setAttribute("data-selftest",JSON.stringify(report));
  },50);
}
if(location.hash==="#fx-selftest")selfTest();
})();
"""
