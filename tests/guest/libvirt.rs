//! vfsd under libvirt 11 (started by scripts/setup.sh, without systemd): libvirt starts
//! the daemon itself from `<filesystem><binary path=…>`, after reading the features its
//! `--print-capabilities` prints.
//!
//! - Save and restore (`virsh save`/`restore`), a managed save (`virsh managedsave`/
//!   `start`) and a live migration to a second libvirtd on this host, each with a new
//!   daemon that loads the device state. The guest (guest-tests/libvirt.sh) writes
//!   through one open fd across it, and, with vfsd and `<lock posix='on' flock='on'/>`,
//!   holds a flock and a POSIX lock the host must see before and after. Without
//!   `migrate-precopy` libvirt refuses the save.
//! - Lock options: refused for a binary with `separate-options`; without it libvirt
//!   passes them in the legacy `-o` form, and the host sees the guest's locks only when
//!   they are on.
//! - The argv libvirt builds for the options it knows, in both forms, and the
//!   `<filesystem>` of vmm-configs/libvirt-virtiofs.xml: the daemon starts, the guest
//!   mounts the share.
//!
//! A wrapper script stands in for the daemon where a test needs other capabilities than
//! the daemon's own: it logs its argv and answers `--print-capabilities` itself.

use std::os::unix::fs::{chown, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

use crate::fixture::{assets, daemon_under_test, DaemonKind, Slot, TestDir};

const URI: &str = "qemu:///system";
/// The guest of the write tests: 30 lines before the host saves, at most 3000 in all (5
/// minutes).
const WRITE: &str = "write 30 3000";

/// virsh on `uri`, stopped after 5 minutes (a save that never ends fails the test
/// instead).
fn virsh_at(uri: &str, args: &[&str]) -> Output {
    Command::new("timeout")
        .args(["300", "virsh", "-c", uri])
        .args(args)
        .output()
        .expect("virsh (scripts/setup.sh installs libvirt 11)")
}

fn virsh(args: &[&str]) -> Output {
    virsh_at(URI, args)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).trim().to_string()
}

fn virsh_ok(what: &str, args: &[&str]) {
    let o = virsh(args);
    assert!(o.status.success(), "virsh {what}: {}", stderr(&o));
}

/// Destroys and undefines the domain (with any managed save) when dropped.
struct Domain(String);

impl Drop for Domain {
    fn drop(&mut self) {
        let _ = virsh(&["destroy", &self.0]);
        let _ = virsh(&["undefine", "--managed-save", &self.0]);
    }
}

/// A test's share, daemon binary and domain name.
struct Setup {
    dir: TestDir,
    share: PathBuf,
    /// The guest's directory in the share: its markers, data.log, the lock tool.
    lv: PathBuf,
    /// The daemon under test, copied: libvirt runs it from a path of its own.
    daemon: PathBuf,
    console: PathBuf,
    domain: String,
}

impl Setup {
    fn new(test: &str, tag: &str) -> Setup {
        let dir = TestDir::new(test);
        let daemon = dir.path.join("daemon");
        let source = match daemon_under_test() {
            DaemonKind::Virtiofsd => crate::fixture::virtiofsd_bin(),
            _ => crate::fixture::vfsd_bin(),
        };
        std::fs::copy(&source, &daemon).unwrap();
        let share = dir.dir("share");
        let lv = share.join("lv");
        std::fs::create_dir_all(&lv).unwrap();
        Setup {
            console: dir.path.join("console.log"),
            domain: format!("vfsd-test-{}-{tag}", std::process::id()),
            dir,
            share,
            lv,
            daemon,
        }
    }

    /// The guest's lock tool in lv/, static (the initramfs has no libc); the host runs
    /// the same.
    fn with_lock_tool(self) -> Setup {
        crate::fixture::build_lock_tool(&self.lv.join("vfsd-lock"), true);
        self
    }

    /// A `<binary path>` that logs its argv to argv.log and answers
    /// `--print-capabilities` with `features` only, then runs the daemon.
    fn wrapper(&self, features: &[&str]) -> PathBuf {
        let path = self.dir.path.join("wrapper.sh");
        let features: Vec<String> = features.iter().map(|f| format!("\"{f}\"")).collect();
        std::fs::write(
            &path,
            format!(
                "#!/bin/sh\necho \"$*\" >> '{log}'\n\
                 if [ \"$1\" = --print-capabilities ]; then\n    \
                 echo '{{\"type\": \"fs\", \"features\": [{features}]}}'\n    exit 0\nfi\n\
                 exec '{daemon}' \"$@\"\n",
                log = self.dir.path.join("argv.log").display(),
                features = features.join(", "),
                daemon = self.daemon.display(),
            ),
        )
        .unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    /// The last argv the wrapper ran the daemon with.
    fn argv(&self) -> String {
        std::fs::read_to_string(self.dir.path.join("argv.log"))
            .unwrap_or_default()
            .lines()
            .rev()
            .find(|l| !l.starts_with("--print-capabilities"))
            .unwrap_or("")
            .to_string()
    }

    /// A `<filesystem>` on the share run by `binary`, with `inner` in `<binary>` and
    /// `extra` after `<target>`.
    fn filesystem(&self, binary: &Path, inner: &str, extra: &str) -> String {
        format!(
            "<filesystem type='mount' accessmode='passthrough'>
      <driver type='virtiofs' queue='1024'/>
      <binary path='{binary}' xattr='on'>{inner}</binary>
      <source dir='{share}'/>
      <target dir='share0'/>{extra}
    </filesystem>",
            binary = binary.display(),
            share = self.share.display(),
        )
    }

    /// domain.xml: a TCG domain with `filesystem` whose guest runs
    /// `/guest-tests/libvirt.sh <guest>`.
    fn xml(&self, filesystem: &str, guest: &str) -> String {
        let path = self.dir.path.join("domain.xml");
        std::fs::write(
            &path,
            domain_xml(&self.domain, filesystem, &self.console, guest),
        )
        .unwrap();
        path.to_string_lossy().into_owned()
    }

    fn console_text(&self) -> String {
        std::fs::read_to_string(&self.console).unwrap_or_default()
    }

    /// Waits for lv/`file`, at most `secs` and only while the domain runs on `uri`.
    fn wait(&self, file: &str, secs: u64, uri: &str) -> bool {
        let path = self.lv.join(file);
        let t = Instant::now();
        while !path.exists() {
            if t.elapsed() > Duration::from_secs(secs) {
                return false;
            }
            let st = virsh_at(uri, &["domstate", &self.domain]);
            if !String::from_utf8_lossy(&st.stdout).starts_with("running") {
                return path.exists();
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        true
    }

    /// The guest's result line, which must start with PASS.
    fn assert_guest_passed(&self, uri: &str, when: &str) -> String {
        assert!(
            self.wait("guest.result", 300, uri),
            "no guest result {when}:\n{}",
            self.console_text()
        );
        let result = std::fs::read_to_string(self.lv.join("guest.result")).unwrap();
        assert!(
            result.starts_with("PASS"),
            "the guest {when}: {result}\n{}",
            self.console_text()
        );
        result.trim().to_string()
    }
}

fn domain_xml(name: &str, filesystem: &str, console: &Path, guest: &str) -> String {
    let a = assets();
    let initrd = crate::fixture::minimal_initrd();
    let cmd = format!("/guest-tests/libvirt.sh {guest}");
    use base64::Engine;
    let cmd = base64::engine::general_purpose::STANDARD.encode(cmd);
    let qemu = crate::fixture::qemu_path();
    format!(
        "<domain type='qemu'>
  <name>{name}</name>
  <memory unit='MiB'>512</memory>
  <vcpu>1</vcpu>
  <memoryBacking><source type='memfd'/><access mode='shared'/></memoryBacking>
  <os>
    <type arch='x86_64' machine='pc'>hvm</type>
    <kernel>{kernel}</kernel>
    <initrd>{initrd}</initrd>
    <cmdline>console=ttyS0 panic=-1 quiet loglevel=4 tsc=reliable vfsd.mounts=share0 vfsd.cmd={cmd}</cmdline>
  </os>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>destroy</on_reboot>
  <on_crash>destroy</on_crash>
  <seclabel type='static' model='dac' relabel='no'><label>+0:+0</label></seclabel>
  <devices>
    <emulator>{qemu}</emulator>
    <controller type='usb' model='none'/>
    <memballoon model='none'/>
    {filesystem}
    <serial type='file'><source path='{console}' append='on'/><target port='0'/></serial>
  </devices>
</domain>
",
        kernel = a.kernel.display(),
        initrd = initrd.display(),
        qemu = qemu.display(),
        console = console.display(),
    )
}

/// What the host sees of the guest's flock and POSIX lock: vfsd-lock's exit status for
/// each (1 refused, 0 granted).
fn host_lock_probe(lv: &Path) -> (Option<i32>, Option<i32>) {
    let tool = lv.join("vfsd-lock");
    let fl = Command::new(&tool)
        .arg("-q")
        .arg(lv.join("flockf"))
        .arg("ex")
        .status()
        .unwrap()
        .code();
    let px = Command::new(&tool)
        .arg("-q")
        .arg("-g")
        .arg(lv.join("posixf"))
        .arg("wr:0:0")
        .output()
        .unwrap()
        .status
        .code();
    (fl, px)
}

/// Whether the guest's flock and POSIX lock both conflict on the host.
fn host_sees_locks(lv: &Path) -> (bool, String) {
    let (fl, px) = host_lock_probe(lv);
    (
        fl == Some(1) && px == Some(1),
        format!("host flock -> {fl:?}, F_GETLK -> {px:?} (1 refused, 0 granted)"),
    )
}

/// The lines "line 1".."line N" of data.log as the host sees it: N, if they are in order.
fn lines_in_order(path: &Path) -> Option<usize> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut n = 0;
    for (i, l) in text.lines().enumerate() {
        if l != format!("line {}", i + 1) {
            return None;
        }
        n = i + 1;
    }
    Some(n)
}

/// A second libvirtd on this host that believes it is another one (libvirt refuses to
/// migrate to its own host name or host UUID): new mount and UTS namespaces with its
/// own state directories, host name, `host_uuid` and socket. Its domains are destroyed
/// and it is stopped when dropped.
struct SecondLibvirtd {
    child: Child,
    uri: String,
    sock_dir: PathBuf,
}

impl SecondLibvirtd {
    fn start(root: &Path) -> SecondLibvirtd {
        for d in ["run", "lib", "log", "etc", "cache"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        // A socket path has at most 107 bytes; the test's directory is longer.
        let sock_dir = std::env::temp_dir().join(format!("vfsd-lv2-{}", std::process::id()));
        std::fs::create_dir_all(&sock_dir).unwrap();
        let st = Command::new("cp")
            .arg("-a")
            .arg("/etc/libvirt/.")
            .arg(root.join("etc"))
            .status()
            .unwrap();
        assert!(st.success(), "copying /etc/libvirt");
        let uuid = std::fs::read_to_string("/proc/sys/kernel/random/uuid").unwrap();
        let append = |file: &str, text: String| {
            use std::io::Write;
            std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .open(root.join("etc").join(file))
                .unwrap()
                .write_all(text.as_bytes())
                .unwrap();
        };
        append(
            "libvirtd.conf",
            format!(
                "\nhost_uuid = \"{}\"\nunix_sock_dir = \"{}\"\n",
                uuid.trim(),
                sock_dir.display()
            ),
        );
        // QEMU's and the daemon's logs go to files: no second virtlogd.
        append("qemu.conf", "\nstdio_handler = \"file\"\n".into());
        let r = root.display();
        let script = format!(
            "hostname vfsd-lv-second
mount --bind '{r}/run' /run/libvirt
mount --bind '{r}/lib' /var/lib/libvirt
mount --bind '{r}/log' /var/log/libvirt
mount --bind '{r}/cache' /var/cache/libvirt
mount --bind '{r}/etc' /etc/libvirt
mkdir -p /var/log/libvirt/qemu /var/lib/libvirt/qemu
exec libvirtd -f /etc/libvirt/libvirtd.conf -p '{r}/libvirtd.pid'"
        );
        let out = std::fs::File::create(root.join("libvirtd.out")).unwrap();
        let mut child = crate::fixture::die_with_parent(
            Command::new("unshare")
                .args(["-m", "-u", "--propagation", "private", "sh", "-c"])
                .arg(script)
                .stdout(out.try_clone().unwrap())
                .stderr(out),
        )
        .spawn()
        .expect("unshare");
        let uri = format!(
            "qemu+unix:///system?socket={}",
            sock_dir.join("libvirt-sock").display()
        );
        let t = Instant::now();
        while !virsh_at(&uri, &["version"]).status.success() {
            assert!(
                child.try_wait().unwrap().is_none() && t.elapsed() < Duration::from_secs(30),
                "the second libvirtd did not come up: {}",
                std::fs::read_to_string(root.join("libvirtd.out")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
        SecondLibvirtd {
            child,
            uri,
            sock_dir,
        }
    }
}

impl Drop for SecondLibvirtd {
    fn drop(&mut self) {
        let list = virsh_at(&self.uri, &["list", "--name"]);
        for d in String::from_utf8_lossy(&list.stdout).split_whitespace() {
            let _ = virsh_at(&self.uri, &["destroy", d]);
        }
        crate::fixture::stop(&mut self.child, Duration::from_secs(10));
        let _ = std::fs::remove_dir_all(&self.sock_dir);
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Save {
    /// `virsh save FILE` of a transient domain, then `virsh restore FILE`.
    ToFile,
    /// `virsh managedsave` of a defined domain, then `virsh start`.
    Managed,
    /// `virsh migrate --live` to a second libvirtd on this host.
    Live,
}

fn save_and_restore(name: &str, how: Save) {
    let tag = match how {
        Save::ToFile => "save",
        Save::Managed => "msave",
        Save::Live => "live",
    };
    let s = Setup::new(name, tag).with_lock_tool();
    let locks = daemon_under_test() == DaemonKind::Vfsd;
    if locks {
        std::fs::write(s.lv.join("hold-locks"), "").unwrap();
    }
    let lock = if locks {
        "<lock posix='on' flock='on'/>"
    } else {
        ""
    };
    let xml = s.xml(&s.filesystem(&s.daemon, lock, ""), WRITE);
    let second = (how == Save::Live).then(|| SecondLibvirtd::start(&s.dir.path.join("lv2")));
    // Where the domain runs after the save or migration.
    let after_uri = second.as_ref().map_or(URI, |l| l.uri.as_str());
    let _slot = Slot::take(1);
    let _guard = Domain(s.domain.clone());
    let domain = s.domain.as_str();
    match how {
        Save::ToFile | Save::Live => virsh_ok("create", &["create", "--validate", &xml]),
        Save::Managed => {
            virsh_ok("define", &["define", "--validate", &xml]);
            virsh_ok("start", &["start", domain]);
        }
    }
    assert!(
        s.wait("guest.ready", 300, URI),
        "the guest did not come up:\n{}",
        s.console_text()
    );
    let ino0 = std::fs::metadata(s.lv.join("data.log")).unwrap().ino();
    if locks {
        let (held, how_seen) = host_sees_locks(&s.lv);
        assert!(
            held,
            "the guest's locks are not seen on the host before the save: {how_seen}"
        );
    }
    let state = s.dir.path.join("state.sav");
    let state_s = state.to_string_lossy().into_owned();
    let n_before = lines_in_order(&s.lv.join("data.log")).unwrap_or(0);
    let t = Instant::now();
    match how {
        Save::ToFile => virsh_ok("save", &["save", domain, &state_s]),
        Save::Managed => virsh_ok("managedsave", &["managedsave", domain]),
        Save::Live => virsh_ok(
            "migrate",
            &[
                "migrate",
                "--live",
                domain,
                after_uri,
                "--migrateuri",
                "tcp://127.0.0.1",
            ],
        ),
    }
    let saved_in = t.elapsed();
    let n0 = match how {
        Save::Live => n_before,
        _ => lines_in_order(&s.lv.join("data.log")).expect("data.log in order before the restore"),
    };
    match how {
        Save::ToFile => assert!(
            !virsh(&["domstate", domain]).status.success(),
            "the domain is still there after virsh save"
        ),
        Save::Managed => {
            let info = String::from_utf8_lossy(&virsh(&["dominfo", domain]).stdout).into_owned();
            assert!(
                info.lines()
                    .any(|l| l.starts_with("Managed save:") && l.ends_with("yes")),
                "no managed save after virsh managedsave:\n{info}"
            );
        }
        Save::Live => {
            assert!(
                !virsh(&["domstate", domain]).status.success(),
                "the domain is still on the source after virsh migrate"
            );
            let st = virsh_at(after_uri, &["domstate", domain]);
            assert!(
                String::from_utf8_lossy(&st.stdout).starts_with("running"),
                "the domain does not run on the destination: {} {}",
                String::from_utf8_lossy(&st.stdout).trim(),
                stderr(&st)
            );
        }
    }
    let t = Instant::now();
    match how {
        Save::ToFile => {
            std::thread::sleep(Duration::from_secs(2));
            virsh_ok("restore", &["restore", &state_s])
        }
        Save::Managed => {
            std::thread::sleep(Duration::from_secs(2));
            virsh_ok("start", &["start", domain])
        }
        Save::Live => {}
    }
    let restored_in = t.elapsed();
    if locks {
        let (held, how_seen) = host_sees_locks(&s.lv);
        assert!(
            held,
            "the guest's locks are gone on the host after the restore: {how_seen}"
        );
        std::fs::write(s.lv.join("release"), "").unwrap();
    }
    std::fs::write(s.lv.join("host.restored"), "").unwrap();
    assert!(
        s.wait("guest.result", 300, after_uri),
        "no guest result after the restore:\n{}",
        s.console_text()
    );
    let result = std::fs::read_to_string(s.lv.join("guest.result")).unwrap();
    let ino1 = std::fs::metadata(s.lv.join("data.log")).unwrap().ino();
    let n1 = lines_in_order(&s.lv.join("data.log"));
    let what = match how {
        Save::ToFile => "virsh save",
        Save::Managed => "virsh managedsave",
        Save::Live => "virsh migrate --live",
    };
    let resumed = match how {
        Save::Live => {
            let job = virsh_at(after_uri, &["domjobinfo", domain, "--completed"]);
            let job = String::from_utf8_lossy(&job.stdout).into_owned();
            let downtime = job
                .lines()
                .find_map(|l| l.strip_prefix("Total downtime:"))
                .map_or("?".to_string(), |d| {
                    d.split_whitespace().collect::<Vec<_>>().join(" ")
                });
            format!("downtime {downtime}")
        }
        _ => format!("restore {:.1} s", restored_in.as_secs_f64()),
    };
    let figures = format!(
        "{what}: {:.1} s, {resumed}, {n0} lines before, {} after; guest: {}",
        saved_in.as_secs_f64(),
        n1.map_or("not in order".to_string(), |n| n.to_string()),
        result.trim()
    );
    crate::fixture::summarize(name, &figures);
    assert!(
        result.starts_with("PASS"),
        "the guest after the restore: {result}\n{}",
        s.console_text()
    );
    assert_eq!(ino0, ino1, "data.log is another file after the restore");
    assert!(
        n1.is_some_and(|n| n > n0),
        "the host sees data.log {n1:?} lines in order, {n0} before the save"
    );
}

#[test]
#[ignore = "needs QEMU and root"]
fn libvirt_saves_and_restores_a_domain_with_its_open_file_and_locks() {
    save_and_restore(
        "libvirt_saves_and_restores_a_domain_with_its_open_file_and_locks",
        Save::ToFile,
    );
}

#[test]
#[ignore = "needs QEMU and root"]
fn libvirt_managedsave_and_start_keep_the_open_file_and_locks() {
    save_and_restore(
        "libvirt_managedsave_and_start_keep_the_open_file_and_locks",
        Save::Managed,
    );
}

#[test]
#[ignore = "needs QEMU and root"]
fn libvirt_migrates_a_domain_live_to_a_second_libvirtd_with_its_open_file_and_locks() {
    save_and_restore(
        "libvirt_migrates_a_domain_live_to_a_second_libvirtd_with_its_open_file_and_locks",
        Save::Live,
    );
}

#[test]
#[ignore = "needs QEMU and root"]
fn libvirt_refuses_to_save_a_domain_whose_daemon_lacks_migrate_precopy() {
    let s = Setup::new(
        "libvirt_refuses_to_save_a_domain_whose_daemon_lacks_migrate_precopy",
        "nosave",
    );
    let xml = s.xml(&s.filesystem(&s.wrapper(&[]), "", ""), WRITE);
    let _slot = Slot::take(1);
    let _guard = Domain(s.domain.clone());
    virsh_ok("create", &["create", "--validate", &xml]);
    assert!(
        s.wait("guest.ready", 300, URI),
        "the guest did not come up:\n{}",
        s.console_text()
    );
    let state = s.dir.path.join("state.sav");
    let o = virsh(&["save", &s.domain, &state.to_string_lossy()]);
    let err = stderr(&o);
    assert!(
        !o.status.success(),
        "libvirt saved a domain whose daemon does not print migrate-precopy"
    );
    assert!(
        err.contains("migration with this virtiofs device is not supported"),
        "virsh save failed otherwise: {err}"
    );
    let st = virsh(&["domstate", &s.domain]);
    assert!(
        String::from_utf8_lossy(&st.stdout).starts_with("running"),
        "the domain stopped after the refused save"
    );
}

#[test]
#[ignore = "needs QEMU and root"]
fn libvirt_refuses_lock_options_for_a_daemon_with_separate_options() {
    let s = Setup::new(
        "libvirt_refuses_lock_options_for_a_daemon_with_separate_options",
        "lockrefused",
    );
    let bin = s.wrapper(&["migrate-precopy", "separate-options"]);
    let xml = s.xml(
        &s.filesystem(&bin, "<lock posix='on' flock='on'/>", ""),
        "mount",
    );
    let _slot = Slot::take(1);
    let _guard = Domain(s.domain.clone());
    let o = virsh(&["create", "--validate", &xml]);
    assert!(
        !o.status.success(),
        "libvirt started a domain with <lock> for a separate-options daemon (argv: {})",
        s.argv()
    );
    let err = stderr(&o);
    assert!(
        err.contains("locking options are not supported by this virtiofsd"),
        "virsh create failed otherwise: {err}"
    );
}

/// A domain with `<lock posix=on|off flock=on|off/>` through a wrapper without
/// `separate-options`: the legacy `-o` form, and whether the host sees the guest's locks.
fn legacy_locks(name: &str, on: bool) {
    let sw = if on { "on" } else { "off" };
    let s = Setup::new(name, &format!("lock{sw}")).with_lock_tool();
    let bin = s.wrapper(&["migrate-precopy"]);
    let xml = s.xml(
        &s.filesystem(&bin, &format!("<lock posix='{sw}' flock='{sw}'/>"), ""),
        "locks",
    );
    let _slot = Slot::take(1);
    let _guard = Domain(s.domain.clone());
    let o = virsh(&["create", "--validate", &xml]);
    if daemon_under_test() == DaemonKind::Virtiofsd && on {
        // virtiofsd 1.14 forwards no locks: it refuses '-o flock'.
        assert!(
            !o.status.success(),
            "virtiofsd started with lock forwarding asked for"
        );
        return;
    }
    assert!(o.status.success(), "virsh create: {}", stderr(&o));
    let argv = s.argv();
    let want = if on {
        ",flock,posix_lock"
    } else {
        ",no_flock,no_posix_lock"
    };
    let source = format!("-o source={},", s.share.display());
    assert!(
        argv.contains(&source) && argv.contains(want),
        "libvirt did not pass '{source}...{want}': {argv}"
    );
    assert!(
        s.wait("posix.held", 300, URI) && s.wait("flock.held", 30, URI),
        "the guest did not take its locks:\n{}",
        s.console_text()
    );
    let (fl, px) = host_lock_probe(&s.lv);
    std::fs::write(s.lv.join("release"), "").unwrap();
    let expect = if on { Some(1) } else { Some(0) };
    assert!(
        fl == expect && px == expect,
        "lock {sw}: host flock -> {fl:?}, F_GETLK -> {px:?} (1 refused, 0 granted)"
    );
    let result = s.assert_guest_passed(URI, "after releasing its locks");
    crate::fixture::summarize(name, &format!("argv: {argv}; guest: {result}"));
}

#[test]
#[ignore = "needs QEMU and root"]
fn libvirt_legacy_lock_on_puts_the_guests_flock_and_posix_lock_on_the_host() {
    legacy_locks(
        "libvirt_legacy_lock_on_puts_the_guests_flock_and_posix_lock_on_the_host",
        true,
    );
}

#[test]
#[ignore = "needs QEMU and root"]
fn libvirt_legacy_lock_off_keeps_the_guests_flock_and_posix_lock_off_the_host() {
    legacy_locks(
        "libvirt_legacy_lock_off_keeps_the_guests_flock_and_posix_lock_off_the_host",
        false,
    );
}

/// A domain whose `<binary>` holds `inner` (and `<filesystem>` `extra`), once through a
/// wrapper with `separate-options` and once without: the argv must hold each of
/// `separate` or `legacy` (`{share}` stands for the share), the daemon must start and the
/// guest mount the share. With `guest_root` the guest's root is that host uid and gid.
/// `tag` names the test's domains: tests that run at once need names of their own.
fn argv_both_forms(
    name: &str,
    tag: &str,
    inner: &str,
    extra: &str,
    separate: &[&str],
    legacy: &[&str],
    guest_root: Option<u32>,
) {
    let mut figures = Vec::new();
    for (form, features, want) in [
        (
            "separate",
            &["migrate-precopy", "separate-options"][..],
            separate,
        ),
        ("legacy", &["migrate-precopy"][..], legacy),
    ] {
        let s = Setup::new(&format!("{name}-{form}"), &format!("{tag}-{form}"));
        if let Some(id) = guest_root {
            chown(&s.lv, Some(id), Some(id)).unwrap();
        }
        let bin = s.wrapper(features);
        let xml = s.xml(&s.filesystem(&bin, inner, extra), "mount");
        let _slot = Slot::take(1);
        let _guard = Domain(s.domain.clone());
        let o = virsh(&["create", "--validate", &xml]);
        let argv = s.argv();
        assert!(o.status.success(), "{form}: virsh create: {}", stderr(&o));
        let share = s.share.display().to_string();
        for w in want {
            let w = w.replace("{share}", &share);
            assert!(argv.contains(&w), "{form}: no '{w}' in the argv: {argv}");
        }
        let result = s.assert_guest_passed(URI, &format!("({form} options)"));
        if let Some(id) = guest_root {
            let owner = std::fs::metadata(s.lv.join("mounted.txt")).unwrap();
            assert_eq!(
                (owner.uid(), owner.gid()),
                (id, id),
                "{form}: the guest root's file on the host"
            );
        }
        figures.push(format!("{form}: {argv}; guest: {result}"));
    }
    crate::fixture::summarize(name, &figures.join(" | "));
}

#[test]
#[ignore = "needs QEMU and root"]
fn libvirt_argv_with_cache_thread_pool_openfiles_and_idmap_starts_the_daemon_in_both_forms() {
    argv_both_forms(
        "libvirt_argv_with_cache_thread_pool_openfiles_and_idmap_starts_the_daemon_in_both_forms",
        "argv-pool",
        "<cache mode='none'/><thread_pool size='3'/><openfiles max='4096'/>",
        "<idmap><uid start='0' target='100000' count='65536'/>\
         <gid start='0' target='100000' count='65536'/></idmap>",
        &[
            "--shared-dir {share} ",
            "--cache never",
            "--xattr",
            "--thread-pool-size=3",
            "--rlimit-nofile=4096",
            "--uid-map=:0:100000:65536:",
            "--gid-map=:0:100000:65536:",
        ],
        &[
            "-o source={share},cache=none,xattr",
            "--thread-pool-size=3",
            "--rlimit-nofile=4096",
            "--uid-map=:0:100000:65536:",
            "--gid-map=:0:100000:65536:",
        ],
        Some(100000),
    );
}

#[test]
#[ignore = "needs QEMU and root"]
fn libvirt_argv_with_cache_always_and_the_chroot_sandbox_starts_the_daemon_in_both_forms() {
    argv_both_forms(
        "libvirt_argv_with_cache_always_and_the_chroot_sandbox_starts_the_daemon_in_both_forms",
        "argv-chroot",
        "<cache mode='always'/><sandbox mode='chroot'/>",
        "",
        &[
            "--shared-dir {share} ",
            "--cache always",
            "--sandbox chroot",
            "--xattr",
        ],
        &["-o source={share},cache=always,sandbox=chroot,xattr"],
        None,
    );
}

/// `xml` with the value of the first attribute that follows `key` (e.g. `<binary path=`)
/// replaced by `value`, in either quote.
fn replace_attr(xml: &str, key: &str, value: &str) -> String {
    let at = xml.find(key).unwrap_or_else(|| panic!("no {key} in {xml}"));
    let open = at + key.len();
    let quote = &xml[open..open + 1];
    let close = open + 1 + xml[open + 1..].find(quote).unwrap();
    format!("{}{quote}{value}{}", &xml[..open], &xml[close..])
}

/// The first `<tag ...>...</tag>` of `xml` after `after` (the config's comment names tags
/// too).
fn element_after<'a>(xml: &'a str, after: &str, tag: &str) -> &'a str {
    let from = xml
        .find(after)
        .unwrap_or_else(|| panic!("no {after} in {xml}"));
    let start = from
        + xml[from..]
            .find(&format!("<{tag}"))
            .unwrap_or_else(|| panic!("no <{tag}> after {after}"));
    let close = format!("</{tag}>");
    let end = start + xml[start..].find(&close).unwrap() + close.len();
    &xml[start..end]
}

/// The `<filesystem>` and `<qemu:override>` of vmm-configs/libvirt-virtiofs.xml: libvirt
/// validates and starts them, QEMU's device has the config's request queues, and the
/// guest mounts the share.
#[test]
#[ignore = "needs QEMU and root"]
fn vmm_configs_libvirt_virtiofs_xml_filesystem_validates_starts_and_mounts() {
    let name = "vmm_configs_libvirt_virtiofs_xml_filesystem_validates_starts_and_mounts";
    let s = Setup::new(name, "config");
    let config = crate::fixture::repo().join("vmm-configs/libvirt-virtiofs.xml");
    let text = std::fs::read_to_string(&config).unwrap();
    let fs = replace_attr(
        element_after(&text, "<devices>", "filesystem"),
        "<binary path=",
        &s.daemon.to_string_lossy(),
    );
    let fs = replace_attr(&fs, "<source dir=", &s.share.to_string_lossy());
    let xml = s.xml(&fs, "mount");
    // The config's <qemu:override> (its request queues) goes with the <filesystem>.
    let qemu_override = element_after(&text, "</devices>", "qemu:override");
    let namespace = "xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'";
    assert!(
        text.contains(namespace),
        "the config declares no {namespace}"
    );
    let domain = std::fs::read_to_string(&xml)
        .unwrap()
        .replacen(
            "<domain type='qemu'>",
            &format!("<domain type='qemu' {namespace}>"),
            1,
        )
        .replacen("</domain>", &format!("{qemu_override}\n</domain>"), 1);
    std::fs::write(&xml, domain).unwrap();
    let _slot = Slot::take(1);
    let _guard = Domain(s.domain.clone());
    let o = virsh(&["create", "--validate", &xml]);
    assert!(
        o.status.success(),
        "the <filesystem> of {} does not start: {}",
        config.display(),
        stderr(&o)
    );
    // QEMU's device, asked while the domain runs, has the config's request queues.
    let o = virsh(&[
        "qemu-monitor-command",
        &s.domain,
        r#"{"execute":"qom-get","arguments":{"path":"/machine/peripheral/ua-share0","property":"num-request-queues"}}"#,
    ]);
    let reply = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && reply.contains(r#""return":2"#),
        "num-request-queues of the config's device: {reply} {}",
        stderr(&o)
    );
    let result = s.assert_guest_passed(URI, "on the config's share");
    crate::fixture::summarize(name, &format!("guest: {result}"));
}

/// Whether a process runs `exe`.
fn running(exe: &Path) -> bool {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .any(|p| std::fs::read_link(p.path().join("exe")).is_ok_and(|e| e == exe))
}

/// The Debian package (scripts/package.sh) installs vfsd as /usr/libexec/vfsd with a
/// vhost-user descriptor, /usr/share/qemu/vhost-user/50-vfsd.json: libvirt then starts
/// vfsd for a `<filesystem>` that names no `<binary>`, and the guest mounts the share.
#[test]
#[ignore = "needs QEMU and root"]
fn libvirt_starts_the_packaged_vfsd_from_its_descriptor_for_a_filesystem_without_binary() {
    let name = "libvirt_starts_the_packaged_vfsd_from_its_descriptor";
    let s = Setup::new(name, "package");
    let repo = crate::fixture::repo();
    let out = Command::new(repo.join("scripts/package.sh"))
        .arg("--prebuilt")
        .output()
        .unwrap();
    assert!(out.status.success(), "scripts/package.sh: {}", stderr(&out));
    let deb = repo.join(String::from_utf8_lossy(&out.stdout).trim());
    let installed_before = Command::new("dpkg")
        .args(["-s", "vfsd"])
        .output()
        .unwrap()
        .status
        .success();
    let o = Command::new("apt-get")
        .args(["install", "-y", "-q", "--allow-downgrades"])
        .arg(&deb)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "apt-get install {}: {}",
        deb.display(),
        stderr(&o)
    );
    struct Remove(bool);
    impl Drop for Remove {
        fn drop(&mut self) {
            if !self.0 {
                let _ = Command::new("dpkg").args(["-r", "vfsd"]).output();
            }
        }
    }
    let _remove = Remove(installed_before);
    let libexec = Path::new("/usr/libexec/vfsd");
    assert!(Path::new("/usr/share/qemu/vhost-user/50-vfsd.json").is_file());
    let fs = format!(
        "<filesystem type='mount' accessmode='passthrough'>
      <driver type='virtiofs' queue='1024'/>
      <source dir='{}'/>
      <target dir='share0'/>
    </filesystem>",
        s.share.display()
    );
    let xml = s.xml(&fs, "mount");
    let _slot = Slot::take(1);
    let _guard = Domain(s.domain.clone());
    let o = virsh(&["create", &xml]);
    assert!(o.status.success(), "virsh create: {}", stderr(&o));
    let t = Instant::now();
    while !running(libexec) {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "libvirt started no /usr/libexec/vfsd:\n{}",
            s.console_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let result = s.assert_guest_passed(URI, "on the packaged vfsd");
    crate::fixture::summarize(name, &format!("guest: {result}"));
}
