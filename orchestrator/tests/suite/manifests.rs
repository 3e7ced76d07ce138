//! The manifest examples under `schemas/examples/` run against the parser, table-driven.
//!
//! - `valid/*.yaml` parse, and their export parses back to an equal value;
//! - `invalid/*.yaml` start with `# expect: <pointer>`: parsing fails at the schema stage, every
//!   error has exactly that pointer, and its line is where that node (or, for a missing key, the
//!   object that lacks it) starts;
//! - `semantic/*.yaml` start with `# expect-semantic: <gist> at <pointer>`: the schema passes
//!   and the semantic stage fails at exactly that pointer and its line.
//!
//! (The conventions are in schemas/README.md.) The expected line is found by walking the text's
//! indentation, independently of the parser's position map. No database is needed.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::LazyLock;

use crate::common::any_node;

use orchestrator::manifest::{
    parse, parse_value, to_yaml, ManifestError, ManifestKind, NodeKnowledge, Stage,
};
use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Tool names in the catalog index the schema author maintains.
static TOOLS: LazyLock<HashSet<String>> = LazyLock::new(|| {
    let text =
        std::fs::read_to_string(repo().join("schemas/tools/index.json")).expect("index.json");
    let index: Value = serde_json::from_str(&text).expect("index.json is JSON");
    crate::common::json::items(&index["tools"])
        .iter()
        .filter_map(|t| t["name"].as_str().map(str::to_owned))
        .collect()
});

/// Language/version pairs of the runtime registry (or the three standard ones).
static RUNTIMES: LazyLock<HashSet<(String, String)>> = LazyLock::new(|| {
    let from_file = std::fs::read_to_string(repo().join("runtime-images/registry.yaml"))
        .ok()
        .and_then(|text| serde_yaml::from_str::<Value>(&text).ok())
        .and_then(|registry| {
            let runtimes = registry.get("runtimes")?.as_array()?.clone();
            Some(
                runtimes
                    .iter()
                    .filter_map(|r| {
                        Some((
                            r["language"].as_str()?.to_owned(),
                            r["version"].as_str()?.to_owned(),
                        ))
                    })
                    .collect::<HashSet<_>>(),
            )
        });
    from_file.unwrap_or_else(|| {
        [("python", "3.11"), ("shell", "bookworm"), ("busybox", "1")]
            .into_iter()
            .map(|(l, v)| (l.to_owned(), v.to_owned()))
            .collect()
    })
});

fn tool_exists(name: &str) -> bool {
    TOOLS.contains(name)
}

fn runtime_known(language: &str, version: &str) -> bool {
    RUNTIMES.contains(&(language.to_owned(), version.to_owned()))
}

/// The node of these tests: the tool catalog index and the runtime registry of the repository.
fn node() -> NodeKnowledge<'static> {
    NodeKnowledge {
        tool_exists: &tool_exists,
        runtime_known: &runtime_known,
        ..any_node()
    }
}

fn pointers(errors: &[ManifestError]) -> HashSet<&str> {
    errors.iter().map(|e| e.pointer.as_str()).collect()
}

/// Whether `errors` are at `pointer` only, each on `line` (`None`: with no line) and, when
/// given, found at `stage`.
fn only_at(
    errors: &[ManifestError],
    pointer: &str,
    line: Option<usize>,
    stage: Option<Stage>,
) -> bool {
    pointers(errors) == HashSet::from([pointer])
        && errors
            .iter()
            .all(|e| e.line == line && stage.is_none_or(|stage| e.stage == stage))
}

struct Example {
    name: String,
    kind: ManifestKind,
    text: String,
}

fn examples(folder: &str) -> Vec<Example> {
    let dir = repo().join("schemas/examples").join(folder);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let text = std::fs::read_to_string(&path).expect("readable example");
            let kind = if name.starts_with("workflow") {
                ManifestKind::Workflow
            } else {
                ManifestKind::Agent
            };
            Example { name, kind, text }
        })
        .collect()
}

/// The value after `# <tag>:` on the first line that has it.
fn header<'t>(text: &'t str, tag: &str) -> Option<&'t str> {
    let prefix = format!("# {tag}:");
    text.lines()
        .find_map(|line| line.strip_prefix(prefix.as_str()))
        .map(str::trim)
}

fn show(errors: &[ManifestError]) -> String {
    errors.iter().map(|e| format!("\n      {e}")).collect()
}

/// One token of a block-style line: a `- ` sequence entry or a `key:`.
#[derive(Debug)]
struct Token {
    line: usize,
    column: usize,
    key: Option<String>,
}

fn tokens(text: &str) -> Vec<Token> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let content = raw.trim_start();
        if content.is_empty() || content.starts_with('#') || content == "---" {
            continue;
        }
        let mut column = raw.len() - content.len();
        let mut rest = content;
        loop {
            if rest == "-" || rest.starts_with("- ") {
                out.push(Token {
                    line: i + 1,
                    column,
                    key: None,
                });
                let after = rest[1..].trim_start();
                column += rest.len() - after.len();
                rest = after;
                continue;
            }
            break;
        }
        let key = rest
            .strip_prefix('"')
            .and_then(|r| r.split_once("\":"))
            .or_else(|| rest.strip_prefix('\'').and_then(|r| r.split_once("':")))
            .or_else(|| {
                rest.split_once(':').filter(|(k, v)| {
                    !k.starts_with(['{', '[']) && (v.is_empty() || v.starts_with(' '))
                })
            })
            .map(|(k, _)| k.trim().to_owned());
        if let Some(key) = key {
            out.push(Token {
                line: i + 1,
                column,
                key: Some(key),
            });
        }
    }
    out
}

/// The line where the node at `pointer` starts, found from indentation alone. A node that is
/// not written in block style (inside `{...}`/`[...]`) or not written at all gets the line of
/// its nearest block-style ancestor, which is where such a node sits.
fn expected_line(text: &str, pointer: &str) -> usize {
    let tokens = tokens(text);
    let Some(first) = tokens.first() else {
        return 1;
    };
    // Current node: index of its token (None = the root) and its line.
    let mut current: Option<usize> = None;
    let mut line = first.line;
    for segment in pointer.split('/').skip(1) {
        let segment = segment.replace("~1", "/").replace("~0", "~");
        let (start, parent_column, parent_is_key) = match current {
            None => (0, -1i64, false),
            Some(i) => (i + 1, tokens[i].column as i64, tokens[i].key.is_some()),
        };
        // Children: following tokens until one at or left of the parent (a key's block
        // sequence may sit at the key's own column).
        let mut child_column: Option<usize> = None;
        let mut found = None;
        let mut index = 0usize;
        for (j, token) in tokens.iter().enumerate().skip(start) {
            let column = token.column as i64;
            let same_column_dash = parent_is_key && token.key.is_none() && column == parent_column;
            if column <= parent_column && !same_column_dash {
                break;
            }
            let level = *child_column.get_or_insert(token.column);
            if token.column != level {
                continue;
            }
            match (&token.key, segment.parse::<usize>()) {
                (Some(key), _) if *key == segment => {
                    found = Some(j);
                    break;
                }
                (None, Ok(wanted)) => {
                    if index == wanted {
                        found = Some(j);
                        break;
                    }
                    index += 1;
                }
                _ => {}
            }
        }
        match found {
            Some(j) => {
                current = Some(j);
                line = tokens[j].line;
            }
            None => break,
        }
    }
    line
}

#[test]
fn the_line_finder_walks_block_yaml() {
    let text = "# c\na: 1\nb:\n  c:\n  - x: 1\n    y: 2\n  - z: {q: 1}\nd: [1, 2]\n";
    assert_eq!(expected_line(text, ""), 2);
    assert_eq!(expected_line(text, "/b/c/0/y"), 6);
    assert_eq!(expected_line(text, "/b/c/1"), 7);
    assert_eq!(expected_line(text, "/b/c/1/z/q"), 7);
    assert_eq!(expected_line(text, "/b/missing"), 3);
    assert_eq!(expected_line(text, "/d/1"), 8);
}

#[test]
fn valid_examples_parse_and_export_round_trips() {
    let examples = examples("valid");
    assert!(!examples.is_empty(), "no valid examples");
    let mut failures = Vec::new();
    for example in &examples {
        match parse(example.kind, &example.text, &any_node()) {
            Ok(parsed) => {
                let exported = to_yaml(&parsed.value);
                match parse(example.kind, &exported, &any_node()) {
                    Ok(again) if again.value == parsed.value => {}
                    Ok(_) => failures.push(format!("{}: export changed the value", example.name)),
                    Err(e) => {
                        failures.push(format!("{}: export does not parse: {e}", example.name))
                    }
                }
                if let Err(e) = parse_value(example.kind, parsed.value.clone(), &any_node()) {
                    failures.push(format!("{}: as JSON: {e}", example.name));
                }
            }
            Err(errors) => failures.push(format!("{}:{}", example.name, show(&errors.0))),
        }
    }
    eprintln!("valid examples: {} parsed", examples.len() - failures.len());
    assert!(
        failures.is_empty(),
        "valid examples refused:\n  {}",
        failures.join("\n  ")
    );
}

#[test]
fn invalid_examples_fail_at_the_expected_pointer_and_line() {
    let examples = examples("invalid");
    let mut checked = 0;
    let mut failures = Vec::new();
    for example in &examples {
        let Some(expect) = header(&example.text, "expect") else {
            failures.push(format!("{}: no `# expect:` line", example.name));
            continue;
        };
        let line = expected_line(&example.text, expect);
        checked += 1;
        let errors = match parse(example.kind, &example.text, &node()) {
            Ok(_) => {
                failures.push(format!("{}: accepted", example.name));
                continue;
            }
            Err(errors) => errors.0,
        };
        if !only_at(&errors, expect, Some(line), Some(Stage::Schema)) {
            failures.push(format!(
                "{}: expected schema errors at {expect} line {line} only, got:{}",
                example.name,
                show(&errors)
            ));
        }
        // The same document as a JSON body fails at the same pointer, without lines.
        if let Ok(value) = serde_yaml::from_str::<Value>(&example.text) {
            match parse_value(example.kind, value, &node()) {
                Ok(_) => failures.push(format!("{}: accepted as JSON", example.name)),
                Err(errors) => {
                    if !only_at(&errors.0, expect, None, None) {
                        failures.push(format!(
                            "{}: as JSON, no error at {expect}:{}",
                            example.name,
                            show(&errors.0)
                        ));
                    }
                }
            }
        }
    }
    eprintln!(
        "invalid examples: {checked} checked, {} as expected",
        checked - failures.len().min(checked)
    );
    assert!(
        failures.is_empty(),
        "invalid examples:\n  {}",
        failures.join("\n  ")
    );
    assert!(checked >= 30, "only {checked} invalid examples");
}

#[test]
fn semantic_examples_pass_the_schema_and_fail_semantically() {
    let examples = examples("semantic");
    let mut failures = Vec::new();
    for example in &examples {
        let Some(expect) = header(&example.text, "expect-semantic") else {
            failures.push(format!("{}: no `# expect-semantic:` line", example.name));
            continue;
        };
        let Some((_, expect)) = expect.rsplit_once(" at ") else {
            failures.push(format!(
                "{}: `# expect-semantic:` has no ` at <pointer>`",
                example.name
            ));
            continue;
        };
        let line = expected_line(&example.text, expect);
        match parse(example.kind, &example.text, &node()) {
            Ok(_) => failures.push(format!("{}: accepted", example.name)),
            Err(errors) => {
                if !only_at(&errors.0, expect, Some(line), Some(Stage::Semantic)) {
                    failures.push(format!(
                        "{}: expected semantic errors at {expect} line {line} only, got:{}",
                        example.name,
                        show(&errors.0)
                    ));
                }
            }
        }
    }
    eprintln!("semantic examples: {} checked", examples.len());
    assert!(
        failures.is_empty(),
        "semantic examples:\n  {}",
        failures.join("\n  ")
    );
}

#[test]
fn yaml_errors_name_line_and_column() {
    let cases = [
        (
            "apiVersion: 100monkeys.ai/v1\nkind: Agent\nmetadata:\n  name: a\n   version: x\n",
            5,
        ),
        ("kind: Agent\nkind: Agent\n", 2),
        ("kind: Agent\n---\nkind: Agent\n", 2),
        ("spec: {tools: [fs.read}\n", 1),
    ];
    for (text, line) in cases {
        let errors = parse(ManifestKind::Agent, text, &node())
            .expect_err("refused")
            .0;
        assert_eq!(errors[0].stage, Stage::Yaml, "{text}");
        assert_eq!(errors[0].line, Some(line), "{text}: {errors:?}");
        assert!(errors[0].column.is_some());
    }
}

const HELLO: &str = "\
apiVersion: 100monkeys.ai/v1
kind: Agent
metadata:
  name: hello
  version: \"1.0.0\"
spec:
  runtime:
    language: python
    version: \"3.11\"
  task:
    instruction: Say hello.
  tools: [fs.read, fs.write]
";

#[test]
fn node_checks_find_unknown_tools_and_runtimes() {
    parse(ManifestKind::Agent, HELLO, &node()).expect("hello parses on this node");
    let text = HELLO
        .replace("[fs.read, fs.write]", "[fs.read, web.teleport]")
        .replace("\"3.11\"", "\"2.7\"");
    let errors = parse(ManifestKind::Agent, &text, &node())
        .expect_err("refused")
        .0;
    let found: Vec<(&str, Option<usize>)> = errors
        .iter()
        .map(|e| (e.pointer.as_str(), e.line))
        .collect();
    assert_eq!(
        found,
        [("/spec/runtime", Some(7)), ("/spec/tools/1", Some(12))],
        "{errors:?}"
    );
    assert!(errors[1].message.contains("web.teleport"));
    // A custom image bypasses the registry.
    let image = HELLO.replace(
        "language: python\n    version: \"3.11\"",
        "image: \"acme/agent:1\"",
    );
    parse(ManifestKind::Agent, &image, &node()).expect("custom image needs no registry entry");
}

#[test]
fn workflow_templates_must_name_existing_states() {
    let text = "\
apiVersion: 100monkeys.ai/v1
kind: Workflow
metadata:
  name: review-flow
  version: \"1.0.0\"
  output_template: {result: \"{{REVIEW.output}}\"}
spec:
  initial_state: WRITE
  states:
    WRITE:
      kind: Agent
      agent: \"{{input.language}}-coder\"
      input: \"{{input.task}} {{state.feedback}}\"
      transitions: [{condition: on_success, target: REVIEW}, {condition: on_failure, target: DONE}]
    REVIEW:
      kind: Agent
      agent: reviewer
      input: \"Review {{WRTIE.output}} and {{blackboard.WRITE.output}} {{#each input.files}}{{name.x}}{{/each}}\"
      transitions: [{condition: always, target: DONE}]
    DONE: {kind: System, command: \"echo done\", transitions: []}
";
    let errors = parse(ManifestKind::Workflow, text, &node())
        .expect_err("refused")
        .0;
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].pointer, "/spec/states/REVIEW/input");
    assert_eq!(errors[0].line, Some(18));
    assert!(
        errors[0]
            .message
            .contains("unknown state `WRTIE` (did you mean `WRITE`?)"),
        "{}",
        errors[0]
    );
    parse(
        ManifestKind::Workflow,
        &text.replace("WRTIE", "WRITE"),
        &node(),
    )
    .expect("fixed");
}

#[test]
fn no_input_makes_the_parser_panic() {
    // Every prefix of every valid example, and each with one byte flipped to a YAML indicator:
    // the parser must answer (accept or refuse), never panic or hang.
    let mut parsed = 0usize;
    for example in examples("valid") {
        let text = &example.text;
        let cuts = text.char_indices().map(|(i, _)| i).step_by(29);
        for cut in cuts {
            let _ = parse(example.kind, &text[..cut], &any_node());
            parsed += 1;
        }
        for (n, (i, _)) in text.char_indices().step_by(37).enumerate() {
            let indicators = [
                ":", "- ", "[", "{", "&a ", "*a", "!", "|", "\"", "'", "\t", "<<: ",
            ];
            for indicator in indicators.iter().skip(n % 3).step_by(3) {
                let mutated = format!("{}{indicator}{}", &text[..i], &text[i..]);
                let _ = parse(example.kind, &mutated, &any_node());
                parsed += 1;
            }
        }
    }
    eprintln!("robustness: {parsed} mutated documents");
}
