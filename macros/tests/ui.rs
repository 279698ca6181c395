//! Compile-time tests of `#[derive(Job)]`: every accepted form in `ui/pass`,
//! every rejected one in `ui/fail` with the compiler's expected output beside
//! it (`*.stderr`).
//!
//! Run with `cargo test -p pgfifo-macros --test ui`. After an intended change
//! to a message, regenerate the expected output with
//! `TRYBUILD=overwrite cargo test -p pgfifo-macros --test ui` and read the
//! diff: each error must point at the token the user wrote.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
