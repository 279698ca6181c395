//! Parsing of the `#[job(...)]` attributes on the type.
//!
//! This module checks the syntax and the type of each value: known keys,
//! no key twice, a string where a string is expected, an integer that fits its
//! type, a well-formed duration. What depends on the value itself (at least one
//! attempt, non-empty queue, non-zero timeout…) is checked in `valid`.

use proc_macro2::Span;
use quote::ToTokens;
use syn::meta::ParseNestedMeta;
use syn::spanned::Spanned;
use syn::{Attribute, Expr, ExprLit, ExprUnary, Lit, LitStr, Token, UnOp};

use crate::ctxt::Ctxt;
use crate::duration::{self, Millis};

/// The name of the helper attribute, `#[job(...)]`.
pub(crate) const JOB: &str = "job";

/// Every key `#[job(...)]` accepts, in the order the error message lists them.
const KEYS: &[&str] = &[
    "queue",
    "kind",
    "max_attempts",
    "timeout",
    "backoff",
    "priority",
    "long",
];

/// A setting's value together with the span of the tokens it was written
/// with, so that later checks can point at them.
#[derive(Debug, Clone)]
pub(crate) struct Attr<T> {
    /// The parsed value.
    pub(crate) value: T,
    /// The span of the value as written (for `priority = -2`, the `-2`).
    pub(crate) span: Span,
}

/// The settings of one job type, merged from all its `#[job(...)]`
/// attributes. `None` means the key was not given (or its value was invalid,
/// in which case an error has been recorded).
#[derive(Debug, Default)]
pub(crate) struct Attrs {
    /// `queue = "..."`.
    pub(crate) queue: Option<Attr<String>>,
    /// `kind = "..."`.
    pub(crate) kind: Option<Attr<String>>,
    /// `max_attempts = N`.
    pub(crate) max_attempts: Option<Attr<u32>>,
    /// `timeout = "30s"`.
    pub(crate) timeout: Option<Attr<Millis>>,
    /// `backoff = "500ms"`.
    pub(crate) backoff: Option<Attr<Millis>>,
    /// `priority = N`, negative allowed.
    pub(crate) priority: Option<Attr<i16>>,
    /// `long`: a flag, no value (the type runs in long mode).
    pub(crate) long: Option<Attr<bool>>,
}

/// Parses every `#[job(...)]` among `attrs`, recording each problem in `cx`
/// and carrying on, so that all of them are reported together.
pub(crate) fn parse(cx: &Ctxt, attrs: &[Attribute]) -> Attrs {
    let mut parser = Parser {
        cx,
        seen: Vec::new(),
        attrs: Attrs::default(),
    };
    for attr in attrs.iter().filter(|attr| attr.path().is_ident(JOB)) {
        if let Err(err) = attr.parse_nested_meta(|meta| parser.entry(meta)) {
            // A syntax error the entry parser could not step over (a missing
            // comma, `#[job]` without parentheses…): the rest of this
            // attribute is skipped, the other attributes are still parsed.
            cx.syn_error(err);
        }
    }
    parser.attrs
}

/// The state of parsing the attributes of one type.
struct Parser<'c> {
    cx: &'c Ctxt,
    /// The keys met so far, to reject the second occurrence of one.
    seen: Vec<&'static str>,
    attrs: Attrs,
}

impl Parser<'_> {
    /// Parses one `key = value` entry. Errors about the entry are recorded and
    /// `Ok` returned, so that parsing goes on with the next entry; only an
    /// error that leaves the input in an unknown state is returned.
    fn entry(&mut self, meta: ParseNestedMeta<'_>) -> syn::Result<()> {
        if meta.path.is_ident("name") {
            // The key of pgfifo 0.1.0, renamed so that one word means one
            // idea: the stored `kind` column, `Job::KIND`, the metrics label.
            self.cx.error_spanned_by(
                &meta.path,
                "`name` is now `kind` (pgfifo 0.2.0): write `kind = \"...\"`; \
                 the stored value, and so the jobs already enqueued, stay the same",
            );
            return skip_value(&meta);
        }
        let Some(key) = KEYS.iter().copied().find(|key| meta.path.is_ident(key)) else {
            let path = meta.path.to_token_stream().to_string().replace(' ', "");
            self.cx.error_spanned_by(
                &meta.path,
                format!(
                    "unknown job attribute `{path}`; expected one of {}",
                    KEYS.iter()
                        .map(|key| format!("`{key}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            );
            return skip_value(&meta);
        };

        if key == "long" {
            return self.flag(&meta, key);
        }

        let Some(value) = self.value(&meta, key)? else {
            return Ok(());
        };

        if self.seen.contains(&key) {
            self.cx.error_spanned_by(
                &meta.path,
                format!("duplicate job attribute `{key}`: it is already set earlier"),
            );
            return Ok(());
        }
        self.seen.push(key);

        let attrs = &mut self.attrs;
        let parsed = match key {
            "queue" => string(&value, key).map(|v| attrs.queue = Some(v)),
            "kind" => string(&value, key).map(|v| attrs.kind = Some(v)),
            "max_attempts" => {
                integer(&value, key, "from 1 to 4294967295").map(|v| attrs.max_attempts = Some(v))
            }
            "timeout" => duration(&value, key).map(|v| attrs.timeout = Some(v)),
            "backoff" => duration(&value, key).map(|v| attrs.backoff = Some(v)),
            "priority" => {
                integer(&value, key, "from -32768 to 32767").map(|v| attrs.priority = Some(v))
            }
            _ => unreachable!("every key of KEYS is handled"),
        };
        if let Err(err) = parsed {
            self.cx.syn_error(err);
        }
        Ok(())
    }

    /// The value after `key =`, parsed as an expression so that anything
    /// written there is consumed whatever its type. `None` (with an error
    /// recorded) if the key has no `=`.
    /// Parses a flag such as `long`, which takes no value.
    fn flag(&mut self, meta: &ParseNestedMeta<'_>, key: &'static str) -> syn::Result<()> {
        if meta.input.peek(Token![=]) || meta.input.peek(syn::token::Paren) {
            self.cx.error_spanned_by(
                &meta.path,
                format!("`{key}` takes no value: write `#[job({key})]`"),
            );
            return skip_value(meta);
        }
        if self.seen.contains(&key) {
            self.cx.error_spanned_by(
                &meta.path,
                format!("duplicate job attribute `{key}`: it is already set earlier"),
            );
            return Ok(());
        }
        self.seen.push(key);
        self.attrs.long = Some(Attr {
            value: true,
            span: meta.path.span(),
        });
        Ok(())
    }

    fn value(&self, meta: &ParseNestedMeta<'_>, key: &str) -> syn::Result<Option<Expr>> {
        if meta.input.peek(Token![=]) {
            return meta.value()?.parse().map(Some);
        }
        self.cx.error_spanned_by(
            &meta.path,
            format!("expected a value for `{key}`, as in `{}`", example(key)),
        );
        skip_value(meta)?;
        Ok(None)
    }
}

/// Consumes what follows a key that is unknown or malformed, whether
/// `= value` or a parenthesized list, so that the next entry can be parsed.
fn skip_value(meta: &ParseNestedMeta<'_>) -> syn::Result<()> {
    if meta.input.peek(Token![=]) {
        meta.value()?.parse::<Expr>()?;
    } else if meta.input.peek(syn::token::Paren) {
        meta.input.parse::<proc_macro2::Group>()?;
    }
    Ok(())
}

/// A correct entry for `key`, quoted in error messages.
fn example(key: &str) -> &'static str {
    match key {
        "queue" => "queue = \"billing\"",
        "kind" => "kind = \"charge_invoice\"",
        "max_attempts" => "max_attempts = 5",
        "timeout" => "timeout = \"30s\"",
        "long" => "long",
        "backoff" => "backoff = \"500ms\"",
        _ => "priority = -2",
    }
}

/// Strips the invisible groups a `macro_rules!` fragment (`$value:expr`) is
/// wrapped in, so that a literal passed through a macro is still a literal.
fn ungroup(mut expr: &Expr) -> &Expr {
    while let Expr::Group(group) = expr {
        expr = &group.expr;
    }
    expr
}

/// A string literal's value.
fn string(value: &Expr, key: &str) -> syn::Result<Attr<String>> {
    let lit = string_literal(value, key)?;
    Ok(Attr {
        value: lit.value(),
        span: value.span(),
    })
}

/// A duration string's value.
fn duration(value: &Expr, key: &str) -> syn::Result<Attr<Millis>> {
    let lit = string_literal(value, key)?;
    match duration::parse(&lit.value()) {
        Ok(millis) => Ok(Attr {
            value: millis,
            span: value.span(),
        }),
        Err(err) => Err(syn::Error::new_spanned(
            value,
            format!("invalid duration {:?} for `{key}`: {err}", lit.value()),
        )),
    }
}

/// The string literal `value` must be.
fn string_literal<'e>(value: &'e Expr, key: &str) -> syn::Result<&'e LitStr> {
    match ungroup(value) {
        Expr::Lit(ExprLit {
            lit: Lit::Str(lit), ..
        }) => Ok(lit),
        _ => Err(syn::Error::new_spanned(
            value,
            format!(
                "expected a string literal for `{key}`, as in `{}`",
                example(key)
            ),
        )),
    }
}

/// An integer literal, optionally negated, converted to `T`. `range` says
/// which values the setting accepts, for the message when `T` cannot hold the
/// number.
fn integer<T>(value: &Expr, key: &str, range: &str) -> syn::Result<Attr<T>>
where
    T: TryFrom<i128>,
{
    let out_of_range =
        || syn::Error::new_spanned(value, format!("`{key}` must be an integer {range}"));
    let (negative, lit) = match ungroup(value) {
        Expr::Lit(ExprLit {
            lit: Lit::Int(lit), ..
        }) => (false, lit),
        Expr::Unary(ExprUnary {
            op: UnOp::Neg(_),
            expr,
            ..
        }) => match ungroup(expr) {
            Expr::Lit(ExprLit {
                lit: Lit::Int(lit), ..
            }) => (true, lit),
            _ => return Err(not_an_integer(value, key)),
        },
        _ => return Err(not_an_integer(value, key)),
    };
    // Literals too large for i128 are out of range for every setting.
    let magnitude: i128 = lit.base10_parse().map_err(|_| out_of_range())?;
    let number = if negative { -magnitude } else { magnitude };
    let value_in_type = T::try_from(number).map_err(|_| out_of_range())?;
    Ok(Attr {
        value: value_in_type,
        span: value.span(),
    })
}

/// The error for a value that is not an integer literal at all.
fn not_an_integer(value: &Expr, key: &str) -> syn::Error {
    syn::Error::new_spanned(
        value,
        format!(
            "expected an integer literal for `{key}`, as in `{}`",
            example(key)
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use syn::parse_quote;

    /// Parses the attributes of `item` and returns them with the error
    /// messages, in order.
    fn parse_item(item: syn::DeriveInput) -> (Attrs, Vec<String>) {
        let cx = Ctxt::new();
        let attrs = parse(&cx, &item.attrs);
        let errors = match cx.check() {
            Ok(()) => Vec::new(),
            Err(err) => err.into_iter().map(|e| e.to_string()).collect(),
        };
        (attrs, errors)
    }

    #[test]
    fn parses_every_key() {
        let (attrs, errors) = parse_item(parse_quote! {
            #[job(queue = "billing", kind = "charge", max_attempts = 7)]
            #[derive(Debug)]
            #[job(timeout = "30s", backoff = "500ms", priority = -2)]
            struct Charge;
        });
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(attrs.queue.unwrap().value, "billing");
        assert_eq!(attrs.kind.unwrap().value, "charge");
        assert_eq!(attrs.max_attempts.unwrap().value, 7);
        assert_eq!(attrs.timeout.unwrap().value, Millis(30_000));
        assert_eq!(attrs.backoff.unwrap().value, Millis(500));
        assert_eq!(attrs.priority.unwrap().value, -2);
    }

    #[test]
    fn the_old_name_key_says_it_is_now_kind() {
        let (attrs, errors) = parse_item(parse_quote! {
            #[job(name = "charge", queue = "billing")]
            struct Charge;
        });
        assert_eq!(
            errors,
            [
                "`name` is now `kind` (pgfifo 0.2.0): write `kind = \"...\"`; the stored \
              value, and so the jobs already enqueued, stay the same"
            ]
        );
        assert!(attrs.kind.is_none());
        assert_eq!(attrs.queue.unwrap().value, "billing");
    }

    #[test]
    fn no_attribute_means_no_setting() {
        let (attrs, errors) = parse_item(parse_quote!(
            struct Charge;
        ));
        assert!(errors.is_empty());
        assert!(attrs.queue.is_none() && attrs.priority.is_none() && attrs.timeout.is_none());
    }

    #[test]
    fn priority_bounds() {
        let (attrs, errors) = parse_item(parse_quote!(
            #[job(priority = -32768)]
            struct A;
        ));
        assert!(errors.is_empty());
        assert_eq!(attrs.priority.unwrap().value, i16::MIN);

        let (_, errors) = parse_item(parse_quote!(
            #[job(priority = 32768)]
            struct A;
        ));
        assert_eq!(
            errors,
            ["`priority` must be an integer from -32768 to 32767"]
        );
    }

    #[test]
    fn collects_every_error() {
        let (attrs, errors) = parse_item(parse_quote! {
            #[job(queu = "billing", max_attempts = "five", timeout = "10 parsecs")]
            #[job(queue = "billing", queue = "other", priority = 40000, kind)]
            #[job(backoff = 3, kind = "ok", foo(bar), serde::x = 1)]
            struct Charge;
        });
        assert_eq!(
            errors,
            [
                "unknown job attribute `queu`; expected one of `queue`, `kind`, \
                 `max_attempts`, `timeout`, `backoff`, `priority`, `long`",
                "expected an integer literal for `max_attempts`, as in `max_attempts = 5`",
                "invalid duration \"10 parsecs\" for `timeout`: expected an integer followed \
                 by a unit among `ms`, `s`, `m` and `h`, such as \"500ms\", \"30s\", \"5m\" \
                 or \"1h\"",
                "duplicate job attribute `queue`: it is already set earlier",
                "`priority` must be an integer from -32768 to 32767",
                "expected a value for `kind`, as in `kind = \"charge_invoice\"`",
                "expected a string literal for `backoff`, as in `backoff = \"500ms\"`",
                "unknown job attribute `foo`; expected one of `queue`, `kind`, \
                 `max_attempts`, `timeout`, `backoff`, `priority`, `long`",
                "unknown job attribute `serde::x`; expected one of `queue`, `kind`, \
                 `max_attempts`, `timeout`, `backoff`, `priority`, `long`",
            ]
        );
        // The valid settings are kept, the first of a duplicate wins.
        assert_eq!(attrs.queue.unwrap().value, "billing");
        assert_eq!(attrs.kind.unwrap().value, "ok");
        assert!(attrs.max_attempts.is_none());
        assert!(attrs.priority.is_none());
    }

    #[test]
    fn max_attempts_bounds() {
        let (_, errors) = parse_item(parse_quote!(
            #[job(max_attempts = -1)]
            struct A;
        ));
        assert_eq!(
            errors,
            ["`max_attempts` must be an integer from 1 to 4294967295"]
        );
        let (_, errors) = parse_item(parse_quote!(
            #[job(max_attempts = 4294967296)]
            struct A;
        ));
        assert_eq!(
            errors,
            ["`max_attempts` must be an integer from 1 to 4294967295"]
        );
        let (attrs, errors) = parse_item(parse_quote!(
            #[job(max_attempts = 4294967295)]
            struct A;
        ));
        assert!(errors.is_empty());
        assert_eq!(attrs.max_attempts.unwrap().value, u32::MAX);
    }

    #[test]
    fn other_attributes_are_ignored() {
        let (_, errors) = parse_item(parse_quote! {
            #[serde(rename_all = "camelCase")]
            #[doc = "x"]
            struct Charge;
        });
        assert!(errors.is_empty());
    }

    #[test]
    fn malformed_attribute_is_reported_and_others_parsed() {
        let (attrs, errors) = parse_item(parse_quote! {
            #[job]
            #[job(queue = "a" "b")]
            #[job(priority = 3)]
            struct Charge;
        });
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert_eq!(attrs.priority.unwrap().value, 3);
    }
}
