//! Where pgfifo's tables live: on one PostgreSQL server (the plain layout)
//! or spread over the workers of a Citus cluster (the distributed layout,
//! docs/scaling.md).
//!
//! One set of SQL serves both. A part of a migration, a function or an
//! operator's statement (`db::admin`) that
//! only the distributed layout needs is written inside a `/*@dist … */`
//! comment: a plain database runs the text as it is, so the comment is
//! skipped, and a distributed one runs it with each such comment replaced
//! by its content (a column `part`, the predicate that names a row's part;
//! the one space after `/*@dist` is not part of it). A statement that only
//! the plain layout runs (the distributed one has its own in a passage) is
//! put between `/*@plain*/` and `/*@end*/`: plain comments for a plain
//! database, and a distributed one runs the text without that stretch.
//! A migration's recorded checksum is that of its text as shipped; the
//! functions' is that of the text as installed, so a database records
//! which form it has.

use std::borrow::Cow;

use serde::Serialize;

/// How pgfifo's tables are laid out in a database.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Layout {
    /// Every table on the server the application connects to: a plain
    /// PostgreSQL, or a Citus coordinator that keeps them as local tables.
    Plain,
    /// Spread over a Citus cluster by part (a fixed hash of a group's queue
    /// and name), laid out by [`distribute`](crate::migrate::distribute).
    Distributed,
}

/// The opening of a passage for the distributed layout only.
const MARK: &str = "/*@dist";
/// The start and end of a stretch for the plain layout only.
const PLAIN: &str = "/*@plain*/";
const END: &str = "/*@end*/";

/// `sql` as it runs in `layout`: unchanged in the plain layout; in the
/// distributed one with every `/*@dist … */` replaced by its content.
pub(crate) fn expand(sql: &str, layout: Layout) -> Cow<'_, str> {
    // The statements expanded at run time (`db::admin`) are checked where
    // they run, in debug builds: the tests run each of them.
    #[cfg(debug_assertions)]
    if let Err(err) = passages(sql) {
        panic!("{err} in: {sql}");
    }
    if layout == Layout::Plain || !sql.contains(MARK) && !sql.contains(PLAIN) {
        return Cow::Borrowed(sql);
    }
    let without_plain = strip_plain(sql);
    let mut out = String::with_capacity(sql.len());
    let mut rest = without_plain.as_str();
    while let Some(at) = rest.find(MARK) {
        out.push_str(&rest[..at]);
        let body = &rest[at + MARK.len()..];
        // The one space after the mark separates it from the content.
        let body = body.strip_prefix(' ').unwrap_or(body);
        // A passage ends at the first `*/`: its content holds no comment
        // (PostgreSQL nests block comments, so one inside would change
        // what the plain layout skips); `passages_are_well_formed` checks.
        let end = body.find("*/").unwrap_or(body.len());
        out.push_str(&body[..end]);
        rest = body.get(end + 2..).unwrap_or("");
    }
    out.push_str(rest);
    Cow::Owned(out)
}

/// `sql` without its plain-only stretches (`/*@plain*/ … /*@end*/`).
fn strip_plain(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut rest = sql;
    while let Some(at) = rest.find(PLAIN) {
        out.push_str(&rest[..at]);
        let body = &rest[at..];
        rest = body.find(END).map_or("", |end| &body[end + END.len()..]);
    }
    out.push_str(rest);
    out
}

/// Every `/*@dist … */` passage of `sql`, for the checks below: its
/// content, or an error saying what is wrong with it.
#[cfg(any(test, debug_assertions))]
pub(crate) fn passages(sql: &str) -> Result<Vec<&str>, String> {
    let mut found = Vec::new();
    let mut rest = sql;
    while let Some(at) = rest.find(MARK) {
        let body = &rest[at + MARK.len()..];
        let end = body
            .find("*/")
            .ok_or_else(|| "a /*@dist passage is not closed".to_owned())?;
        let content = &body[..end];
        if content.contains("/*") {
            return Err(format!("a /*@dist passage holds a comment: {content}"));
        }
        found.push(content);
        rest = &body[end + 2..];
    }
    if sql.matches(PLAIN).count() != sql.matches(END).count() {
        return Err("a /*@plain*/ stretch without its /*@end*/, or the reverse".to_owned());
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plain_layout_runs_the_text_as_shipped() {
        let sql = "INSERT INTO t (a /*@dist , part */) VALUES (1 /*@dist , 7 */);";
        assert_eq!(expand(sql, Layout::Plain), sql);
    }

    #[test]
    fn the_distributed_layout_runs_each_passage() {
        let sql = "INSERT INTO t (a /*@dist , part */) VALUES (1 /*@dist , 7 */); -- end";
        assert_eq!(
            expand(sql, Layout::Distributed),
            "INSERT INTO t (a , part ) VALUES (1 , 7 ); -- end"
        );
        assert_eq!(
            expand("SELECT pgfifo.pick/*@dist _in*/(1)", Layout::Distributed),
            "SELECT pgfifo.pick_in(1)"
        );
        let both = "SELECT /*@plain*/ a /*@end*/ /*@dist b */ FROM t";
        assert_eq!(expand(both, Layout::Plain), both);
        assert_eq!(expand(both, Layout::Distributed), "SELECT  b  FROM t");
        let other = "SELECT 1 /* a plain comment */";
        assert_eq!(expand(other, Layout::Distributed), other);
    }
}
