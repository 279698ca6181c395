//! The error collector threaded through parsing and validation.

use std::cell::RefCell;
use std::fmt::Display;

use quote::ToTokens;

/// Collects every error found in one derive input, so that they are all
/// reported together instead of one per compilation.
///
/// Modelled on `serde_derive`'s `Ctxt`: each phase records what it finds and
/// goes on; [`Ctxt::check`] turns the collection into one [`syn::Error`] that
/// expands to one `compile_error!` per problem, each with its own span.
#[derive(Default)]
pub(crate) struct Ctxt {
    errors: RefCell<Vec<syn::Error>>,
}

impl Ctxt {
    /// An empty collector.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Records an error whose span covers `tokens`.
    pub(crate) fn error_spanned_by<T: ToTokens, M: Display>(&self, tokens: T, message: M) {
        self.syn_error(syn::Error::new_spanned(tokens.into_token_stream(), message));
    }

    /// Records an already built error (it may itself hold several).
    pub(crate) fn syn_error(&self, err: syn::Error) {
        self.errors.borrow_mut().push(err);
    }

    /// `Ok` if nothing was recorded, otherwise every recorded error combined,
    /// in the order they were found.
    pub(crate) fn check(self) -> Result<(), syn::Error> {
        let mut errors = self.errors.into_inner().into_iter();
        let Some(mut combined) = errors.next() else {
            return Ok(());
        };
        for err in errors {
            combined.combine(err);
        }
        Err(combined)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proc_macro2::Span;

    #[test]
    fn empty_context_checks_ok() {
        assert!(Ctxt::new().check().is_ok());
    }

    #[test]
    fn errors_are_combined_in_order() {
        let cx = Ctxt::new();
        cx.syn_error(syn::Error::new(Span::call_site(), "first"));
        cx.error_spanned_by(quote::quote!(x), "second");
        let messages: Vec<String> = cx
            .check()
            .unwrap_err()
            .into_iter()
            .map(|e| e.to_string())
            .collect();
        assert_eq!(messages, ["first", "second"]);
    }
}
