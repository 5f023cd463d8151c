"""The HTML report's inline assets: the error handler, the stylesheet and the table code
(no external URL of any kind; analyzer/render/html.py puts them into the page)."""

ONERROR = """
window.onerror = function (msg, src, line) {
  var p = document.getElementById('errors');
  var text = String(msg) + ' (line ' + line + ')\\n';
  if (p) { p.hidden = false; p.textContent += text; }
  else { document.documentElement.setAttribute('data-errors', text); }
};
window.addEventListener('unhandledrejection', function (e) { window.onerror(e.reason, '', 0); });
"""

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.5em}.headline{font-size:1.15em;margin:.2em 0 1em}h2{margin-top:1.6em;border-bottom:1px solid #ddd}
.dim{color:#777}.warn{background:#fff8e1}#warnings{padding:.2em 1em;border:1px solid #f0c36d}
#errors{color:#b00;background:#fee}
table.kv th{text-align:left;padding-right:1em;font-weight:600;vertical-align:top}
table.plain{border-collapse:collapse}table.plain td,table.plain th{padding:2px 8px;
border-bottom:1px solid #eee;text-align:right}table.plain td:first-child{text-align:left}
.scroll{max-height:70vh;overflow:auto;border:1px solid #ddd}
table.data{border-collapse:collapse;font-size:13px}
table.data th{position:sticky;top:0;background:#f5f5f5;cursor:pointer;user-select:none;
padding:3px 8px;white-space:nowrap;border-bottom:1px solid #ccc}
table.data th[aria-sort=ascending]::after{content:" \\25B2"}
table.data th[aria-sort=descending]::after{content:" \\25BC"}
table.data td{padding:2px 8px;border-bottom:1px solid #f0f0f0;white-space:nowrap}
table.data td.n{text-align:right;font-variant-numeric:tabular-nums}
table.data tr.bad td{background:#fff3cd}
.tools{margin:.4em 0}.tools .count{color:#555;margin:0 1em}.tools label.minor{margin-left:1em}
.chart svg{max-width:100%;height:auto;border:1px solid #eee}
"""

JS = r"""
(function () {
  'use strict';
  // The same units as render.human / render.human_bytes.
  function scaled(n, steps, sep) {
    for (var i = 0; i < steps.length; i++)
      if (Math.abs(n) >= steps[i][0]) return (n / steps[i][0]).toFixed(2) + sep + steps[i][1];
    return null;
  }
  var SI = [[1e12, 'T'], [1e9, 'G'], [1e6, 'M'], [1e3, 'K']];
  var BIN = [[Math.pow(2, 40), 'TiB'], [Math.pow(2, 30), 'GiB'], [Math.pow(2, 20), 'MiB'],
             [1024, 'KiB']];
  function si(n) { return scaled(n, SI, '') || String(Math.trunc(n)); }
  function bytes(n) { return scaled(n, BIN, ' ') || Math.trunc(n) + ' B'; }
  function sec(s) {
    if (s >= 1) return s.toFixed(3) + ' s';
    if (s >= 1e-3) return (s * 1e3).toFixed(3) + ' ms';
    return (s * 1e6).toFixed(2) + ' \u00b5s';
  }
  var FORMAT = {
    idx: String, count: function (n) { return n.toLocaleString('en-US'); },
    si: function (n) { return n ? si(n) : ''; }, bytes: bytes, sec: sec,
    float: function (n) { return n.toFixed(2); }
  };
  var tables = {};

  function Table(spec) {
    this.id = spec.id; this.cols = spec.columns; this.all = spec.rows; this.rows = spec.rows;
    this.cap = spec.cap; this.limit = spec.cap; this.sortCol = -1; this.desc = false;
    this.el = document.getElementById(spec.id);
    this.statusCol = -1; this.query = '';
    // a row's last value, past the columns, marks a node that matters little: hidden until
    // its box is ticked
    this.minorCol = spec.minor ? this.cols.length : -1; this.showMinor = false;
    for (var c = 0; c < this.cols.length; c++) if (this.cols[c][0] === 'status') this.statusCol = c;
    var tr = document.createElement('tr'), self = this;
    this.cols.forEach(function (col, c) {
      var th = document.createElement('th');
      th.textContent = col[1]; th.dataset.key = col[0];
      th.title = 'sort by ' + col[1];
      th.addEventListener('click', function () { self.sortBy(c); });
      tr.appendChild(th);
    });
    this.el.tHead.appendChild(tr);
    var all = document.getElementById(spec.id + '-all');
    if (all) all.addEventListener('click', function () { self.limit = Infinity; self.render(); });
  }
  Table.prototype.column = function (col) {
    if (typeof col === 'number') return col;
    for (var c = 0; c < this.cols.length; c++) if (this.cols[c][0] === col) return c;
    throw new Error('no column ' + col + ' in table ' + this.id);
  };
  // Numbers compare as numbers (missing ones last), text as text; the sort is stable.
  Table.prototype.sortBy = function (col, dir) {
    var c = this.column(col), num = this.cols[c][2] !== 'text';
    if (dir) this.desc = dir === 'desc';
    else this.desc = c === this.sortCol ? !this.desc : num;  // first click: biggest first
    this.sortCol = c;
    var sign = this.desc ? -1 : 1;
    this.all = this.all.slice().sort(function (a, b) {
      var x = a[c], y = b[c];
      if (x === y) return 0;
      if (x === null) return 1;
      if (y === null) return -1;
      return (num ? x - y : (x < y ? -1 : 1)) * sign;
    });
    var ths = this.el.tHead.rows[0].cells;
    for (var i = 0; i < ths.length; i++) ths[i].removeAttribute('aria-sort');
    ths[c].setAttribute('aria-sort', this.desc ? 'descending' : 'ascending');
    this.filter(this.query);
  };
  Table.prototype.filter = function (q) {
    this.query = q = (q || '').toLowerCase();
    var cols = this.cols, minor = this.showMinor ? -1 : this.minorCol;
    this.rows = !q && minor < 0 ? this.all : this.all.filter(function (row) {
      if (minor >= 0 && row[minor]) return false;
      if (!q) return true;
      for (var c = 0; c < cols.length; c++)
        if (cols[c][2] === 'text' && String(row[c]).toLowerCase().indexOf(q) >= 0) return true;
      return false;
    });
    this.render();
  };
  Table.prototype.render = function () {
    var body = document.createElement('tbody'), n = Math.min(this.rows.length, this.limit);
    for (var r = 0; r < n; r++) {
      var row = this.rows[r], tr = document.createElement('tr');
      if (this.statusCol >= 0 && row[this.statusCol] !== 'ok') tr.className = 'bad';
      for (var c = 0; c < this.cols.length; c++) {
        var td = document.createElement('td'), v = row[c], kind = this.cols[c][2];
        if (kind === 'text') td.textContent = v;
        else {
          td.className = 'n';
          if (v !== null) { td.dataset.v = v; td.textContent = FORMAT[kind](v); }
        }
        tr.appendChild(td);
      }
      body.appendChild(tr);
    }
    this.el.replaceChild(body, this.el.tBodies[0]);
    var count = document.getElementById(this.id + '-count');
    var total = this.rows.length.toLocaleString('en-US') + ' rows';
    if (count) count.textContent = n < this.rows.length
      ? 'showing ' + n.toLocaleString('en-US') + ' of ' + total : total;
    var all = document.getElementById(this.id + '-all');
    if (all) all.hidden = n >= this.rows.length;
  };

  var specs = JSON.parse(document.getElementById('gc-data').textContent);
  specs.forEach(function (spec) {
    if (!document.getElementById(spec.id)) return;
    var t = tables[spec.id] = new Table(spec);
    t.filter('');
  });
  var boxes = document.querySelectorAll('input.filter');
  for (var i = 0; i < boxes.length; i++) (function (box) {
    box.addEventListener('input', function () { tables[box.dataset.table].filter(box.value); });
  })(boxes[i]);
  var ticks = document.querySelectorAll('input.minor');
  for (var j = 0; j < ticks.length; j++) (function (box) {
    box.addEventListener('change', function () {
      var t = tables[box.dataset.table];
      t.showMinor = box.checked; t.filter(t.query);
    });
  })(ticks[j]);
  window.graphcost = {
    tables: tables,
    sortTable: function (id, col, dir) { tables[id].sortBy(col, dir); }
  };
  document.body.dataset.ready = '1';
})();
"""
