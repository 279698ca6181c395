//! Semantic checks on a parsed job type: what is well-formed but not allowed.

use syn::{Attribute, Data, Fields};

use crate::ast::Input;
use crate::attr::{Attr, JOB};
use crate::ctxt::Ctxt;
use crate::duration::Millis;

/// The longest queue name, in bytes (the runtime's `MAX_QUEUE_LEN`).
pub(crate) const MAX_QUEUE_LEN: usize = 128;
/// The longest job kind, in bytes.
pub(crate) const MAX_KIND_LEN: usize = 256;

/// Records in `cx` every reason `input` cannot derive `Job`.
pub(crate) fn check(cx: &Ctxt, input: &Input<'_>) {
    check_shape(cx, input);
    check_settings(cx, input);
}

/// The type must be a struct or an enum without generics, and `#[job]` is
/// only meaningful on the type itself.
fn check_shape(cx: &Ctxt, input: &Input<'_>) {
    if let Data::Union(data) = input.data {
        cx.error_spanned_by(
            data.union_token,
            "`#[derive(Job)]` does not support unions: a job is a serde payload, \
             use a struct or an enum",
        );
    }

    let generics = input.generics;
    if !generics.params.is_empty() {
        cx.error_spanned_by(
            generics,
            "`#[derive(Job)]` does not support generic parameters or lifetimes: each job \
             type is registered once under one name, so it must be a concrete type",
        );
    } else if let Some(where_clause) = &generics.where_clause {
        cx.error_spanned_by(
            where_clause,
            "`#[derive(Job)]` does not support a where clause on the job type",
        );
    }

    let misplaced = |attrs: &[Attribute], place: &str| {
        for attr in attrs.iter().filter(|attr| attr.path().is_ident(JOB)) {
            cx.error_spanned_by(
                attr,
                format!("`#[job(...)]` is not allowed on {place}; put it on the type"),
            );
        }
    };
    let fields = |fields: &Fields| {
        for field in fields {
            misplaced(&field.attrs, "a field");
        }
    };
    match input.data {
        Data::Struct(data) => fields(&data.fields),
        Data::Enum(data) => {
            for variant in &data.variants {
                misplaced(&variant.attrs, "a variant");
                fields(&variant.fields);
            }
        }
        Data::Union(data) => {
            for field in &data.fields.named {
                misplaced(&field.attrs, "a field");
            }
        }
    }
}

/// The values of the settings: ranges the types allow but the runtime does
/// not.
fn check_settings(cx: &Ctxt, input: &Input<'_>) {
    let attrs = &input.attrs;
    if let Some(queue) = &attrs.queue {
        check_len(cx, queue, "queue", MAX_QUEUE_LEN);
    }
    if let Some(kind) = &attrs.kind {
        check_len(cx, kind, "kind", MAX_KIND_LEN);
    }
    if let Some(max) = &attrs.max_attempts {
        if max.value == 0 {
            cx.syn_error(syn::Error::new(
                max.span,
                "`max_attempts` must be at least 1: it counts the first run",
            ));
        }
    }
    for (key, duration) in [("timeout", &attrs.timeout), ("backoff", &attrs.backoff)] {
        check_not_zero(cx, key, duration.as_ref());
    }
}

/// A string setting must be 1 to `max` bytes long.
fn check_len(cx: &Ctxt, value: &Attr<String>, key: &str, max: usize) {
    let len = value.value.len();
    if len == 0 {
        cx.syn_error(syn::Error::new(
            value.span,
            format!("`{key}` must not be empty"),
        ));
    } else if len > max {
        cx.syn_error(syn::Error::new(
            value.span,
            format!("`{key}` is {len} bytes long, the most allowed is {max}"),
        ));
    }
}

/// A duration setting must not be zero.
fn check_not_zero(cx: &Ctxt, key: &str, duration: Option<&Attr<Millis>>) {
    if let Some(duration) = duration.filter(|duration| duration.value.is_zero()) {
        cx.syn_error(syn::Error::new(
            duration.span,
            format!("`{key}` must be longer than zero"),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use syn::{parse_quote, DeriveInput};

    /// The error messages for `item`, from parsing and validation.
    fn errors(item: DeriveInput) -> Vec<String> {
        let cx = Ctxt::new();
        let input = Input::from_syn(&cx, &item);
        check(&cx, &input);
        match cx.check() {
            Ok(()) => Vec::new(),
            Err(err) => err.into_iter().map(|e| e.to_string()).collect(),
        }
    }

    #[test]
    fn accepts_a_plain_struct_and_enum() {
        assert!(errors(parse_quote!(
            struct A {
                x: i64,
            }
        ))
        .is_empty());
        assert!(errors(parse_quote!(
            enum B {
                X,
                Y(i64),
            }
        ))
        .is_empty());
    }

    #[test]
    fn rejects_values_out_of_range() {
        let long_queue = "q".repeat(MAX_QUEUE_LEN + 1);
        let longest_kind = "n".repeat(MAX_KIND_LEN);
        assert_eq!(
            errors(parse_quote! {
                #[job(queue = "", kind = "", max_attempts = 0, timeout = "0s", backoff = "0ms")]
                #[job(priority = -32768)]
                struct A;
            }),
            [
                "`queue` must not be empty",
                "`kind` must not be empty",
                "`max_attempts` must be at least 1: it counts the first run",
                "`timeout` must be longer than zero",
                "`backoff` must be longer than zero",
            ]
        );
        assert_eq!(
            errors(parse_quote! {
                #[job(queue = #long_queue, kind = #longest_kind)]
                struct A;
            }),
            ["`queue` is 129 bytes long, the most allowed is 128"]
        );
    }

    #[test]
    fn rejects_generics_unions_and_misplaced_attributes() {
        let messages = errors(parse_quote! {
            union U<'a, T> {
                #[job(queue = "x")]
                a: &'a T,
            }
        });
        assert_eq!(messages.len(), 3, "{messages:?}");
        assert!(messages[0].contains("unions"));
        assert!(messages[1].contains("generic parameters or lifetimes"));
        assert!(messages[2].contains("not allowed on a field"));

        let messages = errors(parse_quote! {
            enum E where i64: Copy {
                #[job(queue = "x")]
                A,
            }
        });
        assert_eq!(messages.len(), 2, "{messages:?}");
        assert!(messages[0].contains("where clause"));
        assert!(messages[1].contains("not allowed on a variant"));
    }
}
