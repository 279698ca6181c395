//! The parsed model of a type deriving `Job`.

use syn::ext::IdentExt;
use syn::{Data, DeriveInput, Generics, Ident};

use crate::attr::{self, Attrs};
use crate::ctxt::Ctxt;

/// The queue of a job type without `#[job(queue = "...")]`.
pub(crate) const DEFAULT_QUEUE: &str = "default";
/// How many attempts a job has without `#[job(max_attempts = N)]`.
pub(crate) const DEFAULT_MAX_ATTEMPTS: u32 = 5;
/// The first retry delay, in milliseconds, without `#[job(backoff = "...")]`.
pub(crate) const DEFAULT_BACKOFF_MILLIS: u64 = 1_000;
/// The priority of a job type without `#[job(priority = N)]`.
pub(crate) const DEFAULT_PRIORITY: i16 = 0;

/// A type deriving `Job`: its name, its shape and its settings.
pub(crate) struct Input<'a> {
    /// The type's name, also the default job kind.
    pub(crate) ident: &'a Ident,
    /// Its generic parameters and where clause, which must be empty.
    pub(crate) generics: &'a Generics,
    /// Whether it is a struct, an enum or a union, with its fields.
    pub(crate) data: &'a Data,
    /// The settings from its `#[job(...)]` attributes.
    pub(crate) attrs: Attrs,
}

impl<'a> Input<'a> {
    /// Builds the model of `input`, recording attribute errors in `cx`.
    pub(crate) fn from_syn(cx: &Ctxt, input: &'a DeriveInput) -> Self {
        Input {
            ident: &input.ident,
            generics: &input.generics,
            data: &input.data,
            attrs: attr::parse(cx, &input.attrs),
        }
    }

    /// The job's kind: `#[job(kind = "...")]`, or else the type's name
    /// (without the `r#` of a raw identifier).
    pub(crate) fn kind(&self) -> String {
        match &self.attrs.kind {
            Some(kind) => kind.value.clone(),
            None => self.ident.unraw().to_string(),
        }
    }

    /// The job's queue.
    pub(crate) fn queue(&self) -> &str {
        self.attrs
            .queue
            .as_ref()
            .map_or(DEFAULT_QUEUE, |queue| queue.value.as_str())
    }

    /// How many times a job may start.
    pub(crate) fn max_attempts(&self) -> u32 {
        self.attrs
            .max_attempts
            .as_ref()
            .map_or(DEFAULT_MAX_ATTEMPTS, |max| max.value)
    }

    /// The run timeout in milliseconds, `None` for the runner's default.
    pub(crate) fn timeout_millis(&self) -> Option<u64> {
        self.attrs.timeout.as_ref().map(|timeout| timeout.value.0)
    }

    /// The first retry delay in milliseconds.
    pub(crate) fn backoff_millis(&self) -> u64 {
        self.attrs
            .backoff
            .as_ref()
            .map_or(DEFAULT_BACKOFF_MILLIS, |backoff| backoff.value.0)
    }

    /// Whether the type runs in long mode (`#[job(long)]`).
    pub(crate) fn long(&self) -> bool {
        self.attrs.long.as_ref().is_some_and(|long| long.value)
    }

    /// The default priority.
    pub(crate) fn priority(&self) -> i16 {
        self.attrs
            .priority
            .as_ref()
            .map_or(DEFAULT_PRIORITY, |priority| priority.value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use syn::parse_quote;

    #[test]
    fn defaults() {
        let input: DeriveInput = parse_quote!(
            struct r#Charge;
        );
        let cx = Ctxt::new();
        let job = Input::from_syn(&cx, &input);
        assert!(cx.check().is_ok());
        assert_eq!(job.kind(), "Charge");
        assert_eq!(job.queue(), "default");
        assert_eq!(job.max_attempts(), 5);
        assert_eq!(job.timeout_millis(), None);
        assert_eq!(job.backoff_millis(), 1_000);
        assert_eq!(job.priority(), 0);
        assert!(!job.long());
    }
}
