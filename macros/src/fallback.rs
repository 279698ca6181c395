//! What the derive emits when the input has errors.

use proc_macro2::TokenStream;

/// The expansion for an input with `errors`: one `compile_error!` per error,
/// each spanned on the offending token, and nothing else.
///
/// `thiserror` adds a stub impl of its trait here so that code using the type
/// does not fail a second time for want of the impl. That is not possible for
/// `Job`: its supertraits require `Serialize` and `DeserializeOwned`, so a stub
/// would add errors of its own whenever the serde derives are missing, and a
/// stub for a union or a generic type cannot be written at all. Emitting no
/// impl (and no registration) keeps the errors to the ones the user wrote;
/// the cost is that an `impl Handler` for the type also reports the missing
/// `Job` impl until the attribute is fixed.
pub(crate) fn expand(errors: syn::Error) -> TokenStream {
    errors.into_compile_error()
}
