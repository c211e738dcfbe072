//! vfsd's man page and shell completions, generated from its command-line definition
//! (`vfsd::cli::Opt`) for the Debian package (scripts/package.sh):
//!
//! ```text
//! vfsd-gen man DIR           # DIR/vfsd.1
//! vfsd-gen completions DIR   # DIR/vfsd.bash, DIR/_vfsd (zsh), DIR/vfsd.fish
//! ```

use std::path::PathBuf;

use clap::CommandFactory;
use clap_complete::Shell;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (what, dir) = match args.as_slice() {
        [w, d] if w == "man" || w == "completions" => (w.as_str(), PathBuf::from(d)),
        _ => {
            eprintln!("usage: vfsd-gen man|completions DIR");
            std::process::exit(2);
        }
    };
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("vfsd-gen: {}: {e}", dir.display());
        std::process::exit(1);
    }
    let cmd = vfsd::cli::Opt::command();
    let result = if what == "man" {
        let mut out = Vec::new();
        clap_mangen::Man::new(cmd)
            .render(&mut out)
            .and_then(|()| std::fs::write(dir.join("vfsd.1"), out))
    } else {
        [Shell::Bash, Shell::Zsh, Shell::Fish]
            .into_iter()
            .try_for_each(|shell| {
                clap_complete::generate_to(shell, &mut cmd.clone(), "vfsd", &dir).map(|_| ())
            })
    };
    if let Err(e) = result {
        eprintln!("vfsd-gen: {what} into {}: {e}", dir.display());
        std::process::exit(1);
    }
}
