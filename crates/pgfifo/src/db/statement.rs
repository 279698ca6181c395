//! Statements that stay prepared on their connection.
//!
//! diesel prepares and caches a statement on the connection when its query
//! type says that its SQL never changes between calls. `sql_query` cannot
//! know that (its text is a runtime string), so each call would be parsed
//! and planned again by the server, after a round trip of its own to
//! prepare it. [`Cached`] is for the statements on the hot path: a `'static`
//! text with `$1`, `$2`, … placeholders and its values bound in that order.
//! Its AST walk only pushes SQL and bind parameters (diesel's stable
//! `QueryFragment` API), so diesel's default cache rule holds, and the
//! cache key is the text with its bind types.

use std::marker::PhantomData;

use diesel::pg::Pg;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::serialize::ToSql;
use diesel::sql_types::{HasSqlType, Untyped};
use diesel::QueryResult;

/// A statement of fixed text whose values are bound in placeholder order:
/// `text` holds `$1` … `$n`, each once and in increasing order (checked by
/// the tests of every statement), and `binds` is a tuple of `n` [`Bind`]s.
/// Rows load as `QueryableByName` types, as with `sql_query`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cached<B> {
    text: &'static str,
    binds: B,
}

/// Builds a [`Cached`] statement. (Debug builds, and so the tests, check
/// every statement's placeholders against its values.)
pub(crate) fn cached<B: Binds>(text: &'static str, binds: B) -> Cached<B> {
    debug_assert!(
        placeholders_in_order(text, B::COUNT),
        "placeholders of {text:?} are not $1..${} in order",
        B::COUNT
    );
    Cached { text, binds }
}

/// One value bound as SQL type `ST`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bind<ST, T>(T, PhantomData<ST>);

/// Binds `value` as SQL type `ST`.
pub(crate) fn bind<ST, T>(value: T) -> Bind<ST, T> {
    Bind(value, PhantomData)
}

/// A tuple of [`Bind`]s, pushed one placeholder at a time.
pub(crate) trait Binds {
    /// How many values there are.
    const COUNT: usize;
    /// Pushes value `index` (from 0).
    fn push<'b>(&'b self, index: usize, out: &mut AstPass<'_, 'b, Pg>) -> QueryResult<()>;
}

macro_rules! binds_for_tuples {
    ($($count:literal: ($($ty:ident $st:ident $idx:tt),+);)+) => {$(
        impl<$($st, $ty),+> Binds for ($(Bind<$st, $ty>,)+)
        where
            $(Pg: HasSqlType<$st>, $ty: ToSql<$st, Pg> + Send,)+
        {
            const COUNT: usize = $count;

            fn push<'b>(&'b self, index: usize, out: &mut AstPass<'_, 'b, Pg>) -> QueryResult<()> {
                match index {
                    $($idx => out.push_bind_param::<$st, $ty>(&self.$idx.0),)+
                    _ => Err(diesel::result::Error::QueryBuilderError(
                        format!("placeholder ${} has no value", index + 1).into(),
                    )),
                }
            }
        }
    )+};
}

binds_for_tuples! {
    1: (T0 S0 0);
    2: (T0 S0 0, T1 S1 1);
    3: (T0 S0 0, T1 S1 1, T2 S2 2);
    4: (T0 S0 0, T1 S1 1, T2 S2 2, T3 S3 3);
    5: (T0 S0 0, T1 S1 1, T2 S2 2, T3 S3 3, T4 S4 4);
    6: (T0 S0 0, T1 S1 1, T2 S2 2, T3 S3 3, T4 S4 4, T5 S5 5);
    7: (T0 S0 0, T1 S1 1, T2 S2 2, T3 S3 3, T4 S4 4, T5 S5 5, T6 S6 6);
    8: (T0 S0 0, T1 S1 1, T2 S2 2, T3 S3 3, T4 S4 4, T5 S5 5, T6 S6 6, T7 S7 7);
    9: (T0 S0 0, T1 S1 1, T2 S2 2, T3 S3 3, T4 S4 4, T5 S5 5, T6 S6 6, T7 S7 7, T8 S8 8);
    10: (T0 S0 0, T1 S1 1, T2 S2 2, T3 S3 3, T4 S4 4, T5 S5 5, T6 S6 6, T7 S7 7, T8 S8 8, T9 S9 9);
    11: (T0 S0 0, T1 S1 1, T2 S2 2, T3 S3 3, T4 S4 4, T5 S5 5, T6 S6 6, T7 S7 7, T8 S8 8, T9 S9 9, T10 S10 10);
    12: (T0 S0 0, T1 S1 1, T2 S2 2, T3 S3 3, T4 S4 4, T5 S5 5, T6 S6 6, T7 S7 7, T8 S8 8, T9 S9 9,
         T10 S10 10, T11 S11 11);
}

/// The pieces of `text` around its placeholders: `(sql before, Some(n))`
/// for each `$n`, then `(rest, None)`.
fn pieces(text: &str) -> impl Iterator<Item = (&str, Option<usize>)> {
    let mut rest = Some(text);
    std::iter::from_fn(move || {
        let text = rest?;
        let bytes = text.as_bytes();
        let mut at = 0;
        while let Some(offset) = text[at..].find('$') {
            let dollar = at + offset;
            let digits = bytes[dollar + 1..]
                .iter()
                .take_while(|b| b.is_ascii_digit())
                .count();
            if digits > 0 {
                let end = dollar + 1 + digits;
                let n = text[dollar + 1..end].parse().ok();
                rest = Some(&text[end..]);
                return Some((&text[..dollar], n));
            }
            at = dollar + 1;
        }
        rest = None;
        Some((text, None))
    })
}

/// Whether `text`'s placeholders are `$1` … `$count`, each once, in order.
pub(crate) fn placeholders_in_order(text: &str, count: usize) -> bool {
    let found: Vec<usize> = pieces(text).filter_map(|(_, n)| n).collect();
    found == (1..=count).collect::<Vec<_>>()
}

impl<B: Binds> QueryFragment<Pg> for Cached<B> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        // diesel numbers bind parameters `$1`, `$2`, … in the order they are
        // pushed, so the text it sends is `text` itself.
        for (sql, placeholder) in pieces(self.text) {
            out.push_sql(sql);
            if let Some(n) = placeholder {
                self.binds.push(n - 1, &mut out)?;
            }
        }
        Ok(())
    }
}

impl<B> QueryId for Cached<B> {
    type QueryId = ();
    // Many statements share this type: the cache keys them by their text.
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<B: Binds> Query for Cached<B> {
    type SqlType = Untyped;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_splits_at_numbered_placeholders_only() {
        let split: Vec<_> = pieces("SELECT f($1, $2) AS x, '$' || $3").collect();
        assert_eq!(
            split,
            vec![
                ("SELECT f(", Some(1)),
                (", ", Some(2)),
                (") AS x, '$' || ", Some(3)),
                ("", None),
            ]
        );
        assert!(placeholders_in_order("SELECT f($1, $2) AS x", 2));
        assert!(!placeholders_in_order("SELECT f($2, $1)", 2));
        assert!(!placeholders_in_order("SELECT f($1, $1)", 2));
        assert!(!placeholders_in_order("SELECT f($1)", 2));
        assert!(placeholders_in_order("SELECT 1", 0));
    }
}
