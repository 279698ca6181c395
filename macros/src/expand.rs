//! The derive's entry point and code generation.

use proc_macro2::{Literal, TokenStream};
use quote::{quote, quote_spanned};
use syn::DeriveInput;

use crate::ast::Input;
use crate::ctxt::Ctxt;
use crate::{fallback, valid};

/// Expands `#[derive(Job)]` on `input` (the item's tokens).
///
/// Kept on `proc_macro2` types so that it runs, and is tested, outside the
/// compiler. Returns the generated code, or the `compile_error!`s of every
/// problem found.
pub(crate) fn derive(input: TokenStream) -> TokenStream {
    let input: DeriveInput = match syn::parse2(input) {
        Ok(input) => input,
        Err(err) => return fallback::expand(err),
    };
    let cx = Ctxt::new();
    let job = Input::from_syn(&cx, &input);
    valid::check(&cx, &job);
    match cx.check() {
        Ok(()) => expand(&job),
        Err(errors) => fallback::expand(errors),
    }
}

/// The `Job` impl and the handler's registration of a valid job type.
///
/// The impl header and the registration carry the span of the type's name:
/// when the type lacks a serde derive (required by `Job`'s supertraits) or a
/// `Handler` impl (required by `registration`), the compiler points at the
/// name the user wrote rather than at the derive.
fn expand(job: &Input<'_>) -> TokenStream {
    let ident = job.ident;
    let span = ident.span();

    let kind = job.kind();
    let queue = job.queue();
    let max_attempts = Literal::u32_unsuffixed(job.max_attempts());
    let timeout = match job.timeout_millis() {
        Some(millis) => {
            let millis = Literal::u64_unsuffixed(millis);
            quote! {
                ::core::option::Option::Some(::core::time::Duration::from_millis(#millis))
            }
        }
        None => quote!(::core::option::Option::None),
    };
    let backoff = Literal::u64_unsuffixed(job.backoff_millis());
    let priority = Literal::i16_unsuffixed(job.priority());
    let long = job.long();

    let impl_header = quote_spanned! {span=>
        #[automatically_derived]
        impl ::pgfifo::Job for #ident
    };
    let registration = quote_spanned! {span=>
        ::pgfifo::__private::registration::<#ident>()
    };

    quote! {
        const _: () = {
            #impl_header {
                const KIND: &'static str = #kind;
                const QUEUE: &'static str = #queue;
                const MAX_ATTEMPTS: u32 = #max_attempts;
                const TIMEOUT: ::core::option::Option<::core::time::Duration> = #timeout;
                const BACKOFF: ::core::time::Duration =
                    ::core::time::Duration::from_millis(#backoff);
                const PRIORITY: i16 = #priority;
                const LONG: bool = #long;
            }

            // The payload's JSON Schema, when the type has one
            // (`pgfifo::job_types`): found by method resolution on the
            // concrete type, so a type without one needs nothing.
            fn __pgfifo_payload_schema() -> ::core::option::Option<::pgfifo::__private::JsonValue> {
                #[allow(unused_imports)]
                use ::pgfifo::__private::{NoPayloadSchema as _, PayloadSchema as _};
                (&::pgfifo::__private::SchemaProbe::<#ident>::new()).payload_schema()
            }

            ::pgfifo::__private::inventory::submit! {
                #registration.with_schema(__pgfifo_payload_schema)
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The expansion of `item` as a string without whitespace, so that
    /// expectations do not depend on how tokens are spaced.
    fn expand_compact(item: TokenStream) -> String {
        compact(&derive(item).to_string())
    }

    fn compact(text: &str) -> String {
        text.chars().filter(|c| !c.is_whitespace()).collect()
    }

    fn assert_contains(haystack: &str, needles: &[&str]) {
        for needle in needles {
            assert!(
                haystack.contains(&compact(needle)),
                "expected `{needle}` in:\n{haystack}"
            );
        }
    }

    #[test]
    fn defaults() {
        let out = expand_compact(quote! {
            #[derive(Serialize, Deserialize)]
            struct MyJob {
                id: i64,
            }
        });
        assert!(out.starts_with("const_:()={"), "{out}");
        assert_contains(
            &out,
            &[
                "#[automatically_derived] impl ::pgfifo::Job for MyJob {",
                r#"const KIND: &'static str = "MyJob";"#,
                r#"const QUEUE: &'static str = "default";"#,
                "const MAX_ATTEMPTS: u32 = 5;",
                "const TIMEOUT: ::core::option::Option<::core::time::Duration> \
                 = ::core::option::Option::None;",
                "const BACKOFF: ::core::time::Duration = \
                 ::core::time::Duration::from_millis(1000);",
                "const PRIORITY: i16 = 0;",
                "SchemaProbe::<MyJob>::new()).payload_schema()",
                "::pgfifo::__private::inventory::submit! { \
                 ::pgfifo::__private::registration::<MyJob>() \
                 .with_schema(__pgfifo_payload_schema) }",
            ],
        );
        assert!(!out.contains("compile_error"));
    }

    #[test]
    fn every_attribute() {
        let out = expand_compact(quote! {
            #[job(queue = "billing", kind = "charge")]
            #[job(max_attempts = 9, timeout = "30s", backoff = "500ms", priority = -2)]
            enum Charge {
                Card { id: i64 },
                Refund(i64),
            }
        });
        assert_contains(
            &out,
            &[
                "impl ::pgfifo::Job for Charge {",
                r#"const KIND: &'static str = "charge";"#,
                r#"const QUEUE: &'static str = "billing";"#,
                "const MAX_ATTEMPTS: u32 = 9;",
                "= ::core::option::Option::Some(::core::time::Duration::from_millis(30000));",
                "::core::time::Duration::from_millis(500);",
                "const PRIORITY: i16 = -2;",
                "registration::<Charge>()",
            ],
        );
    }

    #[test]
    fn raw_identifier_name() {
        let out = expand_compact(quote!(
            struct r#type;
        ));
        assert_contains(
            &out,
            &[
                "impl ::pgfifo::Job for r#type",
                r#"const KIND: &'static str = "type";"#,
            ],
        );
    }

    #[test]
    fn errors_become_compile_errors_and_nothing_else() {
        let out = derive(quote! {
            #[job(queue = "", colour = "red", max_attempts = 0)]
            #[job(queue = "again")]
            struct Bad<T>(T);
        });
        let text = out.to_string();
        assert_eq!(text.matches("compile_error").count(), 5, "{text}");
        for message in [
            "unknown job attribute `colour`",
            "duplicate job attribute `queue`",
            "`queue` must not be empty",
            "`max_attempts` must be at least 1",
            "does not support generic parameters",
        ] {
            assert!(text.contains(message), "expected {message:?} in {text}");
        }
        assert!(!text.contains("impl"), "{text}");
        assert!(!text.contains("submit"), "{text}");
    }

    #[test]
    fn unparsable_input_is_a_compile_error() {
        let text = derive(quote!(
            fn not_a_type() {}
        ))
        .to_string();
        assert!(text.contains("compile_error"), "{text}");
    }
}
