// The JavaScript context of the code interpreter (Debian packages no JavaScript Jupyter kernel):
// one node process per context, one vm context kept across executions (variables, functions and
// required modules persist). Each stdin line is {"code", "env", "token"}; the code runs, then a
// JSON report ({"result": mime bundle} or {"error": {name, value, traceback}}) is written on the
// fd named by AEGIS_CI_REPORT_FD, then the token on stdout and stderr (the server reads output
// up to the token). `import ... from '...'` lines become require() calls and code with a
// top-level `await` runs in an async function whose last expression is its value. Started with
// --typescript, each cell is first compiled by Debian's TypeScript compiler (types stripped, no
// type check), so a TypeScript context keeps its state the same way.
'use strict';
const fs = require('fs');
const vm = require('vm');
const util = require('util');
const readline = require('readline');

const typescript = process.argv.includes('--typescript') ? require('typescript') : null;
const reportFd = Number(process.env.AEGIS_CI_REPORT_FD);
delete process.env.AEGIS_CI_REPORT_FD;

const sandbox = { require, console, process, Buffer, setTimeout, clearTimeout, setInterval,
  clearInterval, setImmediate, clearImmediate, URL, URLSearchParams, TextEncoder, TextDecoder,
  module: { exports: {} }, __dirname: process.cwd(), __filename: 'cell.js' };
sandbox.exports = sandbox.module.exports;
sandbox.globalThis = sandbox;
const context = vm.createContext(sandbox);

function esmToCjs(code) {
  return code
    .replace(/^\s*import\s+\*\s+as\s+(\w+)\s+from\s+(['"][^'"]+['"])\s*;?/gm, 'const $1 = require($2);')
    .replace(/^\s*import\s+\{([^}]*)\}\s+from\s+(['"][^'"]+['"])\s*;?/gm,
      (_, names, mod) => `const {${names.replace(/\s+as\s+/g, ': ')}} = require(${mod});`)
    .replace(/^\s*import\s+(\w+)\s*,\s*\{([^}]*)\}\s+from\s+(['"][^'"]+['"])\s*;?/gm,
      (_, def, names, mod) => `const ${def} = require(${mod}); const {${names.replace(/\s+as\s+/g, ': ')}} = ${def};`)
    .replace(/^\s*import\s+(\w+)\s+from\s+(['"][^'"]+['"])\s*;?/gm, 'const $1 = require($2);')
    .replace(/^\s*import\s+(['"][^'"]+['"])\s*;?/gm, 'require($1);');
}

// Code with a top-level await: an async function returning its last line when that line is an
// expression. Its declarations stay local to that cell (they do not persist to the next one).
function asyncWrapped(code) {
  const lines = code.replace(/\s+$/, '').split('\n');
  let last = lines.length - 1;
  while (last >= 0 && lines[last].trim() === '') last--;
  const tail = last >= 0 ? lines[last].trim() : '';
  if (tail && !/^(const|let|var|function|class|if|for|while|return|throw|try|\}|\/\/)/.test(tail)) {
    lines[last] = 'return (' + tail.replace(/;$/, '') + ');';
  }
  const body = lines.join('\n').replace(/^\s*(const|let)\s+/gm, 'var ');
  return '(async () => {\n' + body + '\n})()';
}

function bundle(value) {
  if (value === undefined) return null;
  const text = typeof value === 'string' ? value : util.inspect(value, { depth: 4 });
  const data = { 'text/plain': text };
  if (value !== null && typeof value === 'object') {
    try { data['application/json'] = JSON.parse(JSON.stringify(value)); } catch (_) { /* not JSON */ }
  }
  return data;
}

function errorOf(e) {
  if (e instanceof Error || (e && typeof e === 'object' && 'stack' in e)) {
    return { name: e.name || 'Error', value: String(e.message), traceback: String(e.stack || '') };
  }
  return { name: 'Error', value: String(e), traceback: String(e) };
}

async function run(request) {
  const saved = {};
  for (const [k, v] of Object.entries(request.env || {})) {
    saved[k] = Object.prototype.hasOwnProperty.call(process.env, k) ? process.env[k] : undefined;
    process.env[k] = v;
  }
  let report;
  try {
    let code = esmToCjs(request.code);
    if (typescript) {
      code = typescript.transpileModule(code, { compilerOptions: {
        target: typescript.ScriptTarget.ES2020, module: typescript.ModuleKind.None,
        removeComments: false } }).outputText;
    }
    let value;
    try {
      value = new vm.Script(code, { filename: 'cell.js' }).runInContext(context, { breakOnSigint: true });
    } catch (e) {
      if (e instanceof SyntaxError && /await/.test(e.message)) {
        code = asyncWrapped(code);
        value = new vm.Script(code, { filename: 'cell.js' }).runInContext(context, { breakOnSigint: true });
      } else {
        throw e;
      }
    }
    if (value && typeof value.then === 'function') value = await value;
    report = { result: bundle(value) };
  } catch (e) {
    report = { error: errorOf(e) };
  } finally {
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k]; else process.env[k] = v;
    }
  }
  fs.writeSync(reportFd, JSON.stringify(report) + '\n');
  fs.writeSync(1, request.token);
  fs.writeSync(2, request.token);
}

process.on('SIGINT', () => { /* breakOnSigint stops a running script; idle: nothing to stop */ });
process.on('uncaughtException', (e) => { fs.writeSync(2, 'Uncaught ' + (e && e.stack || e) + '\n'); });
process.on('unhandledRejection', (e) => { fs.writeSync(2, 'Unhandled rejection ' + (e && e.stack || e) + '\n'); });

const rl = readline.createInterface({ input: process.stdin, terminal: false });
let chain = Promise.resolve();
rl.on('line', (line) => {
  let request;
  try { request = JSON.parse(line); } catch (_) { return; }
  chain = chain.then(() => run(request));
});
rl.on('close', () => chain.then(() => process.exit(0)));
