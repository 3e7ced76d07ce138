//! One execution's result, assembled from the server's NDJSON lines under the tool's bounds:
//! stdout and stderr each up to a byte cap, at most [`MAX_IMAGES`] images and
//! [`MAX_RESULTS_BYTES`] of rich results; whatever is cut sets `truncated` and says so in
//! `notice`, never silently. The server's own bounds (8 MiB and 16 images per execution) cut
//! first and tell it on stderr with a `[code interpreter]` line, which sets `truncated` too.

use serde_json::{json, Map, Value};

/// Images (PNG, JPEG, SVG) kept per call; the rest of an image result keeps its other formats.
pub const MAX_IMAGES: usize = 8;
/// Bytes of rich results (their JSON) kept per call.
pub const MAX_RESULTS_BYTES: usize = 4 * 1024 * 1024;
/// The formats of a result that are images.
const IMAGE_KEYS: &[&str] = &["png", "jpeg", "svg"];
/// How the server marks its own notices on stderr.
const SERVER_NOTICE: &str = "[code interpreter] ";

/// What the lines said so far.
#[derive(Debug, Default)]
pub struct Collected {
    stdout: String,
    stderr: String,
    results: Vec<Value>,
    error: Option<Value>,
    execution_count: Option<i64>,
    /// The server said `end_of_execution`.
    pub ended: bool,
    images: usize,
    results_bytes: usize,
    notices: Vec<String>,
    /// Cap of each of stdout and stderr, in bytes.
    cap: usize,
}

impl Collected {
    /// Collects with stdout and stderr capped at `cap` bytes each.
    pub fn new(cap: usize) -> Self {
        Collected {
            cap,
            ..Collected::default()
        }
    }

    /// Takes one line of the server's answer.
    pub fn take(&mut self, line: &[u8]) {
        let Ok(Value::Object(mut line)) = serde_json::from_slice::<Value>(line) else {
            self.note("a line of the server's answer was not a JSON object and was left out");
            return;
        };
        let kind = line.remove("type");
        match kind.as_ref().and_then(Value::as_str) {
            Some("stdout") => {
                let text = text_of(&line);
                self.append(false, &text);
            }
            Some("stderr") => {
                let text = text_of(&line);
                if text.starts_with(SERVER_NOTICE) && text.contains("dropped") {
                    self.note(text.trim_end().trim_start_matches(SERVER_NOTICE));
                }
                self.append(true, &text);
            }
            Some("result") => self.result(line),
            Some("error") => {
                let traceback = match line.get("traceback") {
                    Some(Value::Array(lines)) => lines
                        .iter()
                        .filter_map(Value::as_str)
                        .collect::<Vec<_>>()
                        .join("\n"),
                    Some(Value::String(s)) => s.clone(),
                    _ => String::new(),
                };
                self.error = Some(json!({
                    "name": line.get("name").and_then(Value::as_str).unwrap_or(""),
                    "value": line.get("value").and_then(Value::as_str).unwrap_or(""),
                    "traceback": traceback,
                }));
            }
            Some("number_of_executions") => {
                self.execution_count = line.get("execution_count").and_then(Value::as_i64);
            }
            Some("end_of_execution") => self.ended = true,
            // keepalive, and kinds a newer server may add.
            _ => {}
        }
    }

    fn append(&mut self, stderr: bool, text: &str) {
        let cap = self.cap;
        let into = if stderr {
            &mut self.stderr
        } else {
            &mut self.stdout
        };
        let room = cap.saturating_sub(into.len());
        if text.len() <= room {
            into.push_str(text);
            return;
        }
        let mut cut = room;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        into.push_str(&text[..cut]);
        let name = if stderr { "stderr" } else { "stdout" };
        self.note(&format!("{name} beyond {cap} bytes was dropped"));
    }

    fn result(&mut self, mut line: Map<String, Value>) {
        line.remove("timestamp");
        if IMAGE_KEYS.iter().any(|k| line.contains_key(*k)) {
            if self.images >= MAX_IMAGES {
                for key in IMAGE_KEYS {
                    line.remove(*key);
                }
                self.note(&format!("images beyond {MAX_IMAGES} per call were dropped"));
            } else {
                self.images += 1;
            }
        }
        let size = aegis_core::arguments::serialized_len(&Value::Object(line.clone()));
        if self.results_bytes + size > MAX_RESULTS_BYTES {
            self.note(&format!(
                "results beyond {MAX_RESULTS_BYTES} bytes per call were dropped"
            ));
            return;
        }
        self.results_bytes += size;
        self.results.push(Value::Object(line));
    }

    /// Ends the collection early: the rest of the answer was not read, for `why`.
    pub fn cut(&mut self, why: &str) {
        self.note(why);
        self.ended = true;
    }

    fn note(&mut self, text: &str) {
        if !self.notices.iter().any(|n| n == text) {
            self.notices.push(text.to_owned());
        }
    }

    /// The tool's output. `timed_out`: the call passed its timeout after `secs` seconds.
    pub fn finish(
        mut self,
        timed_out: Option<u64>,
        context_id: Option<&str>,
        language: Option<&str>,
    ) -> Value {
        if let Some(secs) = timed_out {
            self.error = Some(json!({
                "name": "TimeoutError",
                "value": format!(
                    "the execution passed timeout_secs ({secs} s) and is being interrupted; \
                     the context and its state remain"
                ),
                "traceback": "",
            }));
        } else if !self.ended && self.error.is_none() {
            self.error = Some(json!({
                "name": "ExecutionEnded",
                "value": "the interpreter server ended the answer before the execution's end",
                "traceback": "",
            }));
        }
        let truncated = !self.notices.is_empty();
        let mut out = json!({
            "context_id": context_id,
            "language": language,
            "stdout": self.stdout,
            "stderr": self.stderr,
            "results": self.results,
            "error": self.error,
            "execution_count": self.execution_count,
            "timed_out": timed_out.is_some(),
            "truncated": truncated,
        });
        if truncated {
            out["notice"] = json!(self.notices.join("; "));
        }
        out
    }
}

fn text_of(line: &Map<String, Value>) -> String {
    line.get("text")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(cap: usize, lines: &[Value]) -> Value {
        let mut c = Collected::new(cap);
        for line in lines {
            c.take(line.to_string().as_bytes());
        }
        c.finish(None, None, Some("python"))
    }

    #[test]
    fn streams_results_errors_and_counts_are_kept_apart() {
        let out = collect(
            1024,
            &[
                json!({"type": "stdout", "text": "a\n", "timestamp": 1}),
                json!({"type": "stderr", "text": "b\n"}),
                json!({"type": "result", "text": "2", "is_main_result": true}),
                json!({"type": "error", "name": "ValueError", "value": "boom", "traceback": ["l1", "l2"]}),
                json!({"type": "number_of_executions", "execution_count": 3}),
                json!({"type": "keepalive"}),
                json!({"type": "end_of_execution"}),
            ],
        );
        assert_eq!(out["stdout"], "a\n");
        assert_eq!(out["stderr"], "b\n");
        assert_eq!(
            out["results"],
            json!([{"text": "2", "is_main_result": true}])
        );
        assert_eq!(
            out["error"],
            json!({"name": "ValueError", "value": "boom", "traceback": "l1\nl2"})
        );
        assert_eq!(out["execution_count"], 3);
        assert_eq!(out["truncated"], false);
        assert!(out.get("notice").is_none());
    }

    #[test]
    fn what_passes_a_bound_is_cut_and_flagged() {
        let mut lines = vec![json!({"type": "stdout", "text": "ééééé"})];
        for _ in 0..MAX_IMAGES + 2 {
            lines.push(json!({"type": "result", "png": "iVBOR", "text": "<Figure>"}));
        }
        lines.push(json!({"type": "end_of_execution"}));
        let out = collect(5, &lines);
        assert_eq!(
            out["stdout"], "éé",
            "cut at a character boundary within 5 bytes"
        );
        assert_eq!(out["truncated"], true);
        let results = out["results"].as_array().expect("results");
        assert_eq!(
            results.len(),
            MAX_IMAGES + 2,
            "the text of a dropped image stays"
        );
        assert_eq!(
            results.iter().filter(|r| r.get("png").is_some()).count(),
            MAX_IMAGES
        );
        let notice = out["notice"].as_str().expect("notice");
        assert!(
            notice.contains("stdout beyond 5 bytes") && notice.contains("images beyond"),
            "{notice}"
        );
    }

    #[test]
    fn the_servers_own_cut_is_flagged_and_a_missing_end_is_an_error() {
        let out = collect(
            1024,
            &[
                json!({"type": "stderr", "text": "[code interpreter] output beyond 8388608 bytes was dropped\n"}),
            ],
        );
        assert_eq!(out["truncated"], true);
        assert_eq!(out["error"]["name"], "ExecutionEnded");
    }

    #[test]
    fn a_timeout_is_an_error_naming_its_seconds() {
        let c = Collected::new(10);
        let out = c.finish(Some(2), Some("ctx"), None);
        assert_eq!(out["timed_out"], true);
        assert_eq!(out["error"]["name"], "TimeoutError");
        assert_eq!(out["context_id"], "ctx");
    }
}
