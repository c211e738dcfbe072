//! Live migration of a guest between two QEMU on this host, each with its own daemon on
//! one shared directory, driven over QMP. The guest (guest-tests/migrate.sh) writes
//! numbered lines through one open fd every ~100 ms with its cwd in the share, holding a
//! flock, a POSIX lock and an OFD lock. The host checks the guest's locks are held on the
//! host before and after the switch (vfsd forwards them; virtiofsd keeps them in the
//! guest, so there they are free throughout), then lets the guest check its data, cwd
//! and locks on the destination and release them, and checks they are free.
//!
//! vfsd also carries a lock wait across: the host holds a flock and a POSIX lock the
//! guest is blocked on through the switch, and releases them after it; the destination
//! must grant both. Through the socket, fio with crc32c verify runs across the switch too.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use qapi::qmp;

use crate::fixture::{daemon_under_test, Guest, Share, TestDir, Vm};

/// Lines the guest writes before the host migrates.
const AFTER_LINES: u64 = 30;

fn host_lock_tool(dir: &TestDir) -> PathBuf {
    let out = dir.path.join("vfsd-lock-host");
    crate::fixture::build_lock_tool(&out, false);
    out
}

/// The guest's three locks as a host process sees them: (flock, POSIX, OFD), each
/// "busy" or "free".
fn host_locks(mig: &Path, tool: &Path) -> [String; 3] {
    let word = |busy: i32, st: Option<i32>| match st {
        Some(c) if c == busy => "busy".to_string(),
        Some(0) => "free".to_string(),
        other => format!("error {other:?}"),
    };
    // The exit status, its output swallowed (the tool prints what holds the lock).
    let code = |c: &mut Command| c.output().ok().and_then(|o| o.status.code());
    let flock = code(
        Command::new("flock")
            .args(["-n", "-E", "99"])
            .arg(mig.join("flock-file"))
            .arg("true"),
    );
    let getlk =
        |file: &str, lock: &str| code(Command::new(tool).arg("-g").arg(mig.join(file)).arg(lock));
    let posix = getlk("posix-file", "wr:0:0");
    let ofd = getlk("ofd-file", "owr:0:0");
    [word(99, flock), word(1, posix), word(1, ofd)]
}

/// Waits up to `secs` for `vm`'s guest to be `running` (an incoming migration done).
fn wait_running(vm: &mut Vm, secs: u64) -> Result<(), String> {
    let t = Instant::now();
    let mut last = String::new();
    while t.elapsed() < Duration::from_secs(secs) {
        if !vm.is_running() {
            return Err(format!("QEMU exited ({last})"));
        }
        match vm.qmp(&qmp::query_status {}) {
            Ok(s) if s.running => return Ok(()),
            Ok(s) => last = format!("{:?}", s.status),
            Err(e) => last = e,
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    Err(format!("not running after {secs} s ({last})"))
}

/// The last "migrate: wrote N lines" count on a console.
fn lines_written(console: &str) -> u64 {
    console
        .lines()
        .rev()
        .filter_map(|l| l.strip_prefix("migrate: wrote "))
        .find_map(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Host processes holding the locks the guest waits for across the migration, until
/// their release file exists.
struct Waiter {
    holders: Vec<Child>,
    release: PathBuf,
}

impl Waiter {
    fn hold(mig: &Path, tool: &Path, release: PathBuf) -> Waiter {
        std::fs::write(mig.join("wait-flock"), "").unwrap();
        std::fs::write(mig.join("wait-posix"), "").unwrap();
        let flock = crate::fixture::die_with_parent(&mut Command::new("flock"))
            .arg(mig.join("wait-flock"))
            .args(["sh", "-c", r#"while [ ! -e "$0" ]; do sleep 0.1; done"#])
            .arg(&release)
            .spawn()
            .expect("flock (util-linux)");
        let posix = crate::fixture::die_with_parent(&mut Command::new(tool))
            .arg("-q")
            .arg("-u")
            .arg(&release)
            .arg(mig.join("wait-posix"))
            .arg("wr:0:0")
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(500));
        Waiter {
            holders: vec![flock, posix],
            release,
        }
    }

    fn release(&mut self) {
        std::fs::write(&self.release, "").unwrap();
        for h in &mut self.holders {
            let t = Instant::now();
            while h.try_wait().unwrap().is_none() {
                assert!(
                    t.elapsed() < Duration::from_secs(10),
                    "a host lock holder did not end"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.release, "");
        for h in &mut self.holders {
            let _ = h.kill();
            let _ = h.wait();
        }
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Via {
    Socket,
    File,
}

fn migrate(name: &str, via: Via) {
    let dir = TestDir::new(name);
    let tool = host_lock_tool(&dir);
    let daemon = daemon_under_test();
    let vfsd = daemon.is_vfsd();
    let share = dir.dir("share");
    let mig = share.join("mig");
    std::fs::create_dir_all(&mig).unwrap();
    let mut extras = Vec::new();
    if vfsd {
        extras.push("waiter");
    }
    if via == Via::Socket {
        extras.push("fio");
    }
    let mut waiter = vfsd.then(|| Waiter::hold(&mig, &tool, dir.path.join("release-waiter")));
    let guest =
        Guest::new(&dir)
            .mem_mb(1024)
            .share(Share::new(&share, "share0", daemon.clone(), &[]));
    let cmd = format!("/guest-tests/migrate.sh 20 900 {}", extras.join(" "));

    // The source, once the guest writes (a boot that fails before /init: once more).
    let _slots = crate::fixture::Slot::take(2);
    let (mut src_daemons, mut src) = {
        let mut attempt = 1;
        loop {
            let mut d = guest.start_daemons(&format!("a{attempt}"));
            let mut vm = guest.start_vm(&format!("a{attempt}"), &d, &cmd, &[]);
            let t = Instant::now();
            let up = loop {
                let c = vm.console_text();
                if c.contains("migrate: ready") && lines_written(&c) >= AFTER_LINES {
                    break true;
                }
                assert!(
                    !c.lines().any(|l| l.starts_with("migrate: FAIL")
                        || l.starts_with("migrate: SKIP")
                        || l.starts_with("VFSD-RESULT:")),
                    "the guest failed before the migration:\n{c}"
                );
                // A guest kernel that crashed or hung before /init: one more boot.
                let kernel_died = ["Kernel panic", "Oops", "BUG:"]
                    .iter()
                    .any(|p| c.contains(p));
                let running = vm.is_running();
                if !c.contains("vfsd-init:")
                    && ((!running && kernel_died) || t.elapsed() > Duration::from_secs(180))
                {
                    break false;
                }
                assert!(
                    running,
                    "the source QEMU exited before the guest was ready:\n{c}"
                );
                assert!(
                    d.list.iter_mut().all(|x| x.is_running()),
                    "the source daemon exited before the guest was ready:\n{c}"
                );
                assert!(
                    t.elapsed() < Duration::from_secs(400),
                    "the source guest did not start writing within 400 s:\n{c}"
                );
                std::thread::sleep(Duration::from_secs(1));
            };
            if up {
                break (d, vm);
            }
            assert!(attempt < 2, "the source guest did not come up twice");
            crate::fixture::summarize(
                name,
                "the source guest's kernel failed before /init ran; booted again",
            );
            attempt += 1;
        }
    };

    let locks_before = host_locks(&mig, &tool);
    let expect = if vfsd { "busy" } else { "free" };
    assert!(
        locks_before.iter().all(|l| l == expect),
        "the guest's flock, POSIX and OFD locks as the host sees them before the migration: {locks_before:?}, expected {expect}"
    );

    // The destination, and the migration.
    let dst_sock_dir = src_daemons.sockets[0].parent().unwrap().to_path_buf();
    let state = dir.path.join("state-b.bin");
    let (uri, incoming) = match via {
        Via::Socket => {
            let u = format!("unix:{}", dst_sock_dir.join("mig-b.sock").display());
            (u.clone(), u)
        }
        Via::File => {
            let u = format!("file:{}", state.display());
            (u.clone(), u)
        }
    };
    let mut pending = None;
    if via == Via::Socket {
        let d = guest.start_daemons("b");
        let mut vm = guest.start_vm("b", &d, &cmd, &["-incoming", &incoming]);
        let t = Instant::now();
        while !dst_sock_dir.join("mig-b.sock").exists() {
            assert!(
                vm.is_running(),
                "the destination QEMU exited: {}",
                std::fs::read_to_string(&vm.log).unwrap_or_default()
            );
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "the destination does not listen"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        // The source learns that the destination failed to load (a daemon refusing its
        // state) and resumes by itself.
        let rp = qmp::migrate_set_capabilities {
            capabilities: vec![qmp::MigrationCapabilityStatus {
                capability: qmp::MigrationCapability::return_path,
                state: true,
            }],
        };
        for q in [&src, &vm] {
            q.qmp(&rp).expect("migrate-set-capabilities return-path");
        }
        pending = Some((d, vm));
    }
    src.qmp(&qmp::migrate {
        uri: Some(uri.clone()),
        channels: None,
        detach: None,
        resume: None,
    })
    .expect("QMP migrate");
    let t = Instant::now();
    let info = loop {
        match src.qmp(&qmp::query_migrate {}) {
            Ok(i) => match i.status {
                Some(qmp::MigrationStatus::completed) => break i,
                Some(qmp::MigrationStatus::failed) | Some(qmp::MigrationStatus::cancelled) => {
                    panic!("the migration to {uri} failed: {:?}", i.error_desc)
                }
                _ => {}
            },
            Err(e) => eprintln!("{name}: query-migrate: {e}"),
        }
        assert!(
            src.is_running(),
            "the source QEMU exited during the migration"
        );
        assert!(
            t.elapsed() < Duration::from_secs(600),
            "the migration did not complete in 600 s"
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    let figures = format!(
        "migration via {}: total {} ms, downtime {} ms, setup {} ms, RAM {:.1} MiB",
        if via == Via::Socket { "socket" } else { "file" },
        info.total_time.unwrap_or(-1),
        info.downtime.unwrap_or(-1),
        info.setup_time.unwrap_or(-1),
        info.ram
            .as_ref()
            .map_or(0.0, |r| r.transferred as f64 / 1048576.0)
    );
    eprintln!("{name}: {figures}");

    if let Some((_, vm)) = pending.as_mut() {
        wait_running(vm, 300).unwrap_or_else(|e| panic!("the destination: {e}"));
    }
    // The source goes away; its daemon leaves on the disconnect.
    let _ = src.qmp(&qmp::quit {});
    assert!(
        src.wait(Duration::from_secs(20)).is_some(),
        "the source QEMU did not quit"
    );
    for d in &mut src_daemons.list {
        let st = d.finish(Duration::from_secs(10));
        assert!(
            st.is_some(),
            "the source daemon still runs 10 s after its QEMU quit"
        );
        use std::os::unix::process::ExitStatusExt;
        assert!(
            st.unwrap().signal().is_none(),
            "the source daemon died from a signal"
        );
    }
    let (mut dst_daemons, mut dst) = match pending {
        Some(p) => p,
        None => {
            let free = host_locks(&mig, &tool);
            assert!(
                free.iter().all(|l| l == "free"),
                "with the source gone and no destination yet the host sees the guest's locks {free:?}"
            );
            let d = guest.start_daemons("b");
            let mut vm = guest.start_vm("b", &d, &cmd, &["-incoming", &incoming]);
            wait_running(&mut vm, 300).unwrap_or_else(|e| panic!("the destination: {e}"));
            (d, vm)
        }
    };
    if vfsd {
        let src_log = std::fs::read_to_string(&src_daemons.list[0].log).unwrap_or_default();
        let dst_log = std::fs::read_to_string(&dst_daemons.list[0].log).unwrap_or_default();
        let line = |log: &str, what: &str| {
            log.lines()
                .rfind(|l| l.contains(what))
                .map(|l| l.split_once("] ").map_or(l, |x| x.1).to_string())
        };
        eprintln!("{name}: source: {:?}", line(&src_log, "device state saved"));
        let loaded = line(&dst_log, "device state loaded");
        eprintln!("{name}: destination: {loaded:?}");
        assert!(
            loaded.is_some(),
            "the destination vfsd logged no 'device state loaded'"
        );
    }

    // The destination holds the guest's locks on the host (it may wait a moment for
    // the locks the source released).
    let t = Instant::now();
    let after = loop {
        let l = host_locks(&mig, &tool);
        if l.iter().all(|x| x == expect) || t.elapsed() > Duration::from_secs(5) {
            break l;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(
        after.iter().all(|l| l == expect),
        "the guest's locks after the migration as the host sees them: {after:?}, expected {expect}"
    );
    if let Some(w) = waiter.as_mut() {
        w.release();
    }

    // The guest's own checks on the destination.
    std::fs::write(mig.join("host.migrated"), "migrated by the host\n").unwrap();
    let t = Instant::now();
    while !mig.join("guest.released").exists() && !mig.join("guest.abort").exists() {
        assert!(
            dst.is_running(),
            "the destination QEMU exited:\n{}",
            dst.console_text()
        );
        assert!(
            t.elapsed() < Duration::from_secs(240),
            "the guest did not finish its checks within 240 s of host.migrated:\n{}",
            dst.console_text()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(
        mig.join("guest.released").exists(),
        "the guest gave up:\n{}",
        dst.console_text()
    );
    let released = host_locks(&mig, &tool);
    assert!(
        released.iter().all(|l| l == "free"),
        "after the guest released its locks the host sees {released:?}"
    );
    std::fs::write(mig.join("host.done"), "").unwrap();
    let t = Instant::now();
    let console = loop {
        let c = dst.console_text();
        if c.lines().any(|l| l.starts_with("VFSD-RESULT:")) || !dst.is_running() {
            break c;
        }
        assert!(
            t.elapsed() < Duration::from_secs(300),
            "the guest did not end:\n{c}"
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(
        dst.wait(Duration::from_secs(30)).is_some(),
        "the destination QEMU did not power off within 30 s of its result"
    );
    let report: Vec<&str> = console
        .lines()
        .filter(|l| l.starts_with("migrate: ") && !l.starts_with("migrate: wrote"))
        .collect();
    crate::fixture::summarize(name, &figures);
    for l in report
        .iter()
        .filter(|l| l.contains("FIGURE") || l.contains("checks passed"))
    {
        crate::fixture::summarize(name, l);
    }
    assert!(
        console.lines().any(|l| l == "VFSD-RESULT: 0"),
        "the guest on the destination failed:\n{}",
        report.join("\n")
    );
    for d in &mut dst_daemons.list {
        let st = d.finish(Duration::from_secs(10));
        use std::os::unix::process::ExitStatusExt;
        let st = st.expect("the destination daemon still runs 10 s after its QEMU exited");
        assert!(
            st.signal().is_none(),
            "the destination daemon died from a signal"
        );
    }
}

#[test]
#[ignore = "needs QEMU and root"]
fn live_migration_through_a_socket_keeps_open_files_locks_and_a_lock_wait() {
    migrate(
        "live_migration_through_a_socket_keeps_open_files_locks_and_a_lock_wait",
        Via::Socket,
    );
}

#[test]
#[ignore = "needs QEMU and root"]
fn migration_through_a_file_keeps_open_files_locks_and_a_lock_wait() {
    migrate(
        "migration_through_a_file_keeps_open_files_locks_and_a_lock_wait",
        Via::File,
    );
}
