//! Rewrites the pages generated from saved results, without measuring anything:
//!
//! ```text
//! cargo bench --bench report                  # docs/benchmarks.md and its plots
//! cargo bench --bench report -- xfstests      # docs/xfstests.md
//! cargo bench --bench report -- xfstests --add SUMMARY_JSON [--daemon vfsd|virtiofsd] \
//!     [--commit C] [--date YYYY-MM-DD] [--version V]
//! ```
//!
//! `--add` saves an xfstests run's summary.json under docs/xfstests/ first, with the daemon
//! (default: the one its `run.info` names), the vfsd commit (default: HEAD's), the date
//! (default: the file's modification day, UTC) and, for virtiofsd, its version. A relative
//! SUMMARY_JSON is taken from the repository's root, where cargo runs the bench.

#[path = "../report/benchmarks.rs"]
mod benchmarks;
#[path = "../report/xfstests.rs"]
mod xfstests;

use std::path::Path;

fn usage(why: &str) -> ! {
    eprintln!(
        "{why}\nusage: cargo bench --bench report [-- xfstests [--add SUMMARY_JSON \
         [--daemon vfsd|virtiofsd] [--commit C] [--date YYYY-MM-DD] [--version V]]]"
    );
    std::process::exit(2)
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    // cargo bench passes --bench to every bench target.
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    match args.next().as_deref() {
        None => {
            if !benchmarks::write_page(root) {
                std::process::exit(1);
            }
        }
        Some("xfstests") => {
            let mut add = xfstests::Add::default();
            let mut adding = false;
            while let Some(a) = args.next() {
                let mut value = || {
                    args.next()
                        .unwrap_or_else(|| usage(&format!("{a} needs a value")))
                };
                match a.as_str() {
                    "--add" => (add.summary, adding) = (value().into(), true),
                    "--daemon" => add.daemon = Some(value()),
                    "--commit" => add.commit = Some(value()),
                    "--date" => add.date = Some(value()),
                    "--version" => add.version = Some(value()),
                    "-h" | "--help" => usage(""),
                    other => usage(&format!("unknown argument {other}")),
                }
            }
            let result = (|| {
                if adding {
                    let name = xfstests::add(root, &add)?;
                    eprintln!("saved docs/xfstests/{name}");
                }
                xfstests::write_page(root)
            })();
            if let Err(e) = result {
                eprintln!("report: {e}");
                std::process::exit(1);
            }
            eprintln!("report: wrote docs/xfstests.md");
        }
        Some(other) => usage(&format!("unknown report {other}")),
    }
}
