//! The page generators' tests, on small inputs in a temporary tree. The generators
//! themselves run as `cargo bench --bench report` and at the end of the benches.
//!
//! The helpers the tests share are here, not in the modules' test code: the benches build
//! the modules with cfg(test) but without the test harness, which leaves out every
//! #[test] function and would leave their helpers unused.

mod benchmarks;
mod xfstests;

/// A temporary repository root holding `files` (path under the root, contents).
pub fn tree_with(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (path, text) in files {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    dir
}
