//! scripts/package.sh: the Debian package's file modes, whatever the builder's umask.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

/// The modes `dpkg-deb -c` lists for the package built under `umask`, as (mode, path).
fn listing_built_under(umask: libc::mode_t) -> Result<Vec<(String, String)>, String> {
    let bin = Path::new(crate::common::vfsd_bin());
    // The script packs the release build of the target directory these tests run from.
    let target = bin.parent().unwrap().parent().unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut cmd = Command::new(repo.join("scripts/package.sh"));
    cmd.arg("--prebuilt").env("CARGO_TARGET_DIR", target);
    // SAFETY: umask only sets the child's file creation mask.
    unsafe {
        cmd.pre_exec(move || {
            libc::umask(umask);
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let deb = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let deb = repo.join(deb);
    let list = Command::new("dpkg-deb")
        .arg("-c")
        .arg(&deb)
        .output()
        .unwrap();
    assert!(list.status.success(), "dpkg-deb -c {}", deb.display());
    Ok(String::from_utf8_lossy(&list.stdout)
        .lines()
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w[0].to_string(), w[w.len() - 1].to_string())
        })
        .collect())
}

/// Under umask 077 dpkg-deb refused to build (a 0700 control directory); under 002 the
/// package shipped group-writable directories and files. Both now give 0755 directories,
/// 0644 files and a 0755 daemon.
#[test]
fn the_package_has_0755_directories_and_0644_files_under_any_umask() {
    if Command::new("dpkg-deb").arg("--version").output().is_err() {
        assert_ne!(
            std::env::var("CI").as_deref(),
            Ok("true"),
            "dpkg-deb is missing"
        );
        eprintln!("skipped: no dpkg-deb");
        return;
    }
    for umask in [0o077, 0o002, 0o022] {
        let listing = listing_built_under(umask)
            .unwrap_or_else(|e| panic!("package.sh under umask {umask:03o}: {e}"));
        assert!(listing.len() > 10, "{listing:?}");
        for (mode, path) in &listing {
            let want = if mode.starts_with('d') {
                "drwxr-xr-x"
            } else if path == "./usr/libexec/vfsd" {
                "-rwxr-xr-x"
            } else {
                "-rw-r--r--"
            };
            assert_eq!(mode, want, "umask {umask:03o}: {path}");
        }
    }
}
