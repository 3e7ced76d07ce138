//! How the command line prints: aligned tables for people, the node's JSON for scripts
//! (`--json`), and progress on stderr only when stderr is a terminal (so logs and pipes stay
//! clean).

use std::io::IsTerminal;

use serde_json::Value;

/// Prints a JSON value, pretty, on stdout.
pub fn json(value: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
    );
}

/// A short progress line on stderr, when a person is watching.
pub fn progress(message: &str) {
    if std::io::stderr().is_terminal() {
        eprintln!("{message}");
    }
}

/// A column: its header and the field (dot path) of each row it shows.
pub struct Column<'a> {
    /// Header text.
    pub header: &'a str,
    /// Dot path into the row, e.g. `owner.kind`.
    pub field: &'a str,
}

/// Shorthand for a column list.
pub fn columns<'a>(pairs: &[(&'a str, &'a str)]) -> Vec<Column<'a>> {
    pairs
        .iter()
        .map(|(header, field)| Column { header, field })
        .collect()
}

/// The rows of `rows` (an array) as an aligned table; `empty` when there are none.
pub fn table(rows: &Value, columns: &[Column<'_>], empty: &str) -> String {
    let rows: Vec<&Value> = match rows {
        Value::Array(a) => a.iter().collect(),
        Value::Null => Vec::new(),
        other => vec![other],
    };
    if rows.is_empty() {
        return format!("{empty}\n");
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| columns.iter().map(|c| cell(field(r, c.field))).collect())
        .collect();
    let mut widths: Vec<usize> = columns.iter().map(|c| c.header.chars().count()).collect();
    for row in &cells {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, items: &[String]| {
        let last = items.len().saturating_sub(1);
        for (i, (item, w)) in items.iter().zip(&widths).enumerate() {
            out.push_str(item);
            if i < last {
                out.push_str(&" ".repeat(w - item.chars().count() + 2));
            }
        }
        out.push('\n');
    };
    let headers: Vec<String> = columns.iter().map(|c| c.header.to_uppercase()).collect();
    line(&mut out, &headers);
    for row in &cells {
        line(&mut out, row);
    }
    out
}

/// Prints a listing as every list verb prints one: with `--json` (`as_json`) the node's whole
/// answer as it came, else the rows at `rows` (the answer itself, or a field of it) as an aligned
/// table of `cols` (header, dot path), `empty` when there are none. One place, so the verbs
/// cannot drift on what `--json` prints.
pub fn listing(as_json: bool, answer: &Value, rows: &Value, cols: &[(&str, &str)], empty: &str) {
    if as_json {
        json(answer);
    } else {
        print!("{}", table(rows, &columns(cols), empty));
    }
}

/// Prints what a verb that changes something did: with `--json` (`as_json`) the node's answer
/// as it came, else `line` for a person (`deleted agent x`).
pub fn done(as_json: bool, answer: &Value, line: impl std::fmt::Display) {
    if as_json {
        json(answer);
    } else {
        println!("{line}");
    }
}

/// `key: value` lines for one object, in the order given.
pub fn record(value: &Value, fields: &[(&str, &str)]) -> String {
    let width = fields.iter().map(|(l, _)| l.len()).max().unwrap_or(0);
    fields
        .iter()
        .map(|(label, path)| format!("{label:width$}  {}\n", cell(field(value, path))))
        .collect()
}

/// The value at a dot path (`a.b`), or null.
pub fn field<'v>(value: &'v Value, path: &str) -> &'v Value {
    path.split('.')
        .try_fold(value, |v, part| v.get(part))
        .unwrap_or(&Value::Null)
}

/// One table cell: strings as they are, times shortened to the second, `-` for nothing, other
/// values as compact JSON cut to 60 characters; never a line break.
pub fn cell(value: &Value) -> String {
    let text = match value {
        Value::Null => "-".to_owned(),
        Value::String(s) if s.is_empty() => "-".to_owned(),
        Value::String(s) => short_time(s).unwrap_or_else(|| s.clone()),
        Value::Array(a) if a.iter().all(Value::is_string) => a
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join(","),
        other => other.to_string(),
    };
    clip(&text.replace(['\n', '\r', '\t'], " "), 60)
}

/// `2026-11-23T20:06:46.123456Z` -> `2026-11-23 20:06:46`; None for anything else.
fn short_time(s: &str) -> Option<String> {
    let t = chrono::DateTime::parse_from_rfc3339(s).ok()?;
    Some(
        t.with_timezone(&chrono::Utc)
            .format("%Y-%m-%d %H:%M:%S")
            .to_string(),
    )
}

/// At most `max` characters, with `...` when cut.
pub fn clip(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_owned()
    } else {
        format!(
            "{}...",
            text.chars().take(max.saturating_sub(3)).collect::<String>()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tables_align_columns_and_say_when_empty() {
        let rows = json!([
            {"name": "hello-world", "version": "1.0.0", "owner": {"kind": "operator"}},
            {"name": "x", "version": null, "owner": {"kind": "pool"}},
        ]);
        let cols = columns(&[
            ("name", "name"),
            ("version", "version"),
            ("owner", "owner.kind"),
        ]);
        assert_eq!(
            table(&rows, &cols, "none"),
            "NAME         VERSION  OWNER\n\
             hello-world  1.0.0    operator\n\
             x            -        pool\n"
        );
        assert_eq!(table(&json!([]), &cols, "no agents"), "no agents\n");
    }

    #[test]
    fn cells_are_short_and_on_one_line() {
        assert_eq!(
            cell(&json!("2026-11-23T20:06:46.123456Z")),
            "2026-11-23 20:06:46"
        );
        assert_eq!(cell(&json!("a\nb")), "a b");
        assert_eq!(cell(&json!(["a", "b"])), "a,b");
        assert_eq!(cell(&json!({"k": 1})), "{\"k\":1}");
        assert_eq!(cell(&json!("x".repeat(100))).chars().count(), 60);
    }
}
