//! Output: one JSON document with `--json`, aligned text otherwise.
//!
//! Every command hands [`Output::emit`] a serializable value and a closure
//! that renders it for people; the text forms are built from [`Table`] and
//! [`fields`] so that they all look alike.

use std::fmt::Display;
use std::io::Write;
use std::time::{Duration, SystemTime};

use serde::Serialize;

use crate::error::{CliError, CliResult};

/// Where and how a command prints its result.
#[derive(Debug, Clone, Copy)]
pub struct Output {
    /// Print one JSON document instead of text.
    pub json: bool,
}

impl Output {
    /// Prints `value` as pretty JSON, or what `human` renders from it.
    pub fn emit<T: Serialize>(&self, value: &T, human: impl FnOnce(&T) -> String) -> CliResult {
        let text = if self.json {
            serde_json::to_string_pretty(value)
                .map_err(|err| CliError::failure(format!("cannot encode the result: {err}")))?
        } else {
            human(value)
        };
        let text = text.trim_end_matches('\n');
        if text.is_empty() {
            return Ok(());
        }
        let mut stdout = std::io::stdout().lock();
        match writeln!(stdout, "{text}").and_then(|()| stdout.flush()) {
            Ok(()) => Ok(()),
            // The reader went away (`pgfifo groups | head`): what it wanted
            // it has.
            Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
            Err(err) => Err(CliError::failure(format!("cannot write the output: {err}"))),
        }
    }
}

/// A table with a header line and columns aligned on the widest cell.
#[derive(Debug)]
pub struct Table {
    headers: Vec<&'static str>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column headers.
    pub fn new(headers: &[&'static str]) -> Self {
        Table {
            headers: headers.to_vec(),
            rows: Vec::new(),
        }
    }

    /// Appends a row (one cell per header).
    pub fn row(&mut self, cells: Vec<String>) {
        debug_assert_eq!(cells.len(), self.headers.len(), "one cell per column");
        self.rows.push(cells);
    }

    /// Whether no row was added.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The table as text, one line per row after the header, two spaces
    /// between columns, no trailing spaces.
    pub fn render(&self) -> String {
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(cell.chars().count());
            }
        }
        let header: Vec<String> = self.headers.iter().map(|h| h.to_string()).collect();
        let mut out = String::new();
        for row in std::iter::once(&header).chain(&self.rows) {
            let mut line = String::new();
            for (i, (cell, width)) in row.iter().zip(&widths).enumerate() {
                if i > 0 {
                    line.push_str("  ");
                }
                line.push_str(cell);
                let pad = width.saturating_sub(cell.chars().count());
                line.extend(std::iter::repeat_n(' ', pad));
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// `label: value` lines with the values aligned.
pub fn fields(pairs: &[(&str, String)]) -> String {
    let width = pairs
        .iter()
        .map(|(label, _)| label.chars().count() + 1)
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    for (label, value) in pairs {
        let label = format!("{label}:");
        let mut lines = value.lines();
        out.push_str(&format!(
            "{label:<width$}  {}\n",
            lines.next().unwrap_or("")
        ));
        // Continuation lines of a multi-line value line up under its first.
        for line in lines {
            out.push_str(&format!("{:width$}  {line}\n", ""));
        }
    }
    out
}

/// An optional value, or `-` for none.
pub fn or_dash<T: Display>(value: Option<T>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

/// The name a unit-like enum serializes to (`not_failed`, `retrying`): the
/// text output names states as the JSON output does.
pub fn name_of<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(name)) => name,
        Ok(other) => other.to_string(),
        Err(_) => "?".to_owned(),
    }
}

/// `s` unless `n` is one, for plural nouns.
pub fn plural(n: impl TryInto<u64>) -> &'static str {
    if n.try_into().ok() == Some(1) {
        ""
    } else {
        "s"
    }
}

/// `yes` or `no`.
pub fn yes_no(value: bool) -> String {
    if value { "yes" } else { "no" }.to_owned()
}

/// How long ago `at` was, briefly (`42s`, `3m12s`, `2d04h`).
pub fn ago(at: SystemTime) -> String {
    pgfifo::admin::human(
        SystemTime::now()
            .duration_since(at)
            .unwrap_or(Duration::ZERO),
    )
}

/// A timestamp as RFC 3339 in UTC.
pub fn time(at: SystemTime) -> String {
    pgfifo::admin::rfc3339(at)
}

/// Text squeezed into one table cell: the first line only, at most `max`
/// characters (an ellipsis marks a cut).
pub fn one_line(text: &str, max: usize) -> String {
    let first = text.lines().next().unwrap_or("").trim();
    let cut = text.lines().nth(1).is_some();
    let mut out: String = first.chars().take(max).collect();
    if cut || first.chars().count() > max {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_aligns_columns() {
        let mut t = Table::new(&["ID", "NAME", "NOTE"]);
        t.row(vec!["1".into(), "alpha".into(), "x".into()]);
        t.row(vec!["1234".into(), "b".into(), String::new()]);
        assert_eq!(t.render(), "ID    NAME   NOTE\n1     alpha  x\n1234  b\n");
    }

    #[test]
    fn fields_align_values() {
        let text = fields(&[("id", "7".into()), ("status", "failed\nfor good".into())]);
        assert_eq!(text, "id:      7\nstatus:  failed\n         for good\n");
    }

    #[test]
    fn one_line_cuts() {
        assert_eq!(one_line("short", 10), "short");
        assert_eq!(one_line("abcdefghijk", 5), "abcde…");
        assert_eq!(one_line("first\nsecond", 50), "first…");
    }
}
