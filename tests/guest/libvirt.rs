//! vfsd under libvirt 11 (started by scripts/setup.sh, without systemd): libvirt starts
//! the daemon itself from `<filesystem><binary path=…>`, then saves and restores the
//! domain (`virsh save`/`restore`), or keeps a managed save of it (`virsh
//! managedsave`/`start`), each time with a new daemon that loads the device state. The
//! guest (guest-tests/libvirt.sh) writes through one open fd across it, and, with vfsd and
//! `<lock posix='on' flock='on'/>`, holds a flock and a POSIX lock the host must see
//! before and after.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::fixture::{assets, daemon_under_test, DaemonKind, Slot, TestDir};

const URI: &str = "qemu:///system";
/// Lines the guest writes before the host saves.
const AFTER_LINES: u32 = 30;

/// virsh, stopped after 5 minutes (a save that never ends fails the test instead).
fn virsh(args: &[&str]) -> Output {
    Command::new("timeout")
        .args(["300", "virsh", "-c", URI])
        .args(args)
        .output()
        .expect("virsh (scripts/setup.sh installs libvirt 11)")
}

fn virsh_ok(what: &str, args: &[&str]) {
    let o = virsh(args);
    assert!(
        o.status.success(),
        "virsh {what}: {}",
        String::from_utf8_lossy(&o.stderr).trim()
    );
}

/// Destroys and undefines the domain (with any managed save) when dropped.
struct Domain(String);

impl Drop for Domain {
    fn drop(&mut self) {
        let _ = virsh(&["destroy", &self.0]);
        let _ = virsh(&["undefine", "--managed-save", &self.0]);
    }
}

fn domain_xml(name: &str, binary: &Path, share: &Path, console: &Path, locks: bool) -> String {
    let a = assets();
    let initrd = crate::fixture::minimal_initrd();
    let cmd = format!("/guest-tests/libvirt.sh write {AFTER_LINES} 3000");
    use base64::Engine;
    let cmd = base64::engine::general_purpose::STANDARD.encode(cmd);
    let qemu = crate::fixture::qemu_path();
    let lock = if locks {
        "<lock posix='on' flock='on'/>"
    } else {
        ""
    };
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
    <filesystem type='mount' accessmode='passthrough'>
      <driver type='virtiofs' queue='1024'/>
      <binary path='{binary}' xattr='on'>{lock}</binary>
      <source dir='{share}'/>
      <target dir='share0'/>
    </filesystem>
    <serial type='file'><source path='{console}' append='on'/><target port='0'/></serial>
  </devices>
</domain>
",
        kernel = a.kernel.display(),
        initrd = initrd.display(),
        qemu = qemu.display(),
        binary = binary.display(),
        share = share.display(),
        console = console.display(),
    )
}

fn wait_file(path: &Path, secs: u64, domain: &str) -> bool {
    let t = Instant::now();
    while !path.exists() {
        if t.elapsed() > Duration::from_secs(secs) {
            return false;
        }
        let st = virsh(&["domstate", domain]);
        if !String::from_utf8_lossy(&st.stdout).starts_with("running") {
            return path.exists();
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    true
}

/// Whether the guest's flock and POSIX lock both conflict on the host.
fn host_sees_locks(lv: &Path) -> (bool, String) {
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

#[derive(Clone, Copy, PartialEq)]
enum Save {
    /// `virsh save FILE` of a transient domain, then `virsh restore FILE`.
    ToFile,
    /// `virsh managedsave` of a defined domain, then `virsh start`.
    Managed,
}

fn save_and_restore(name: &str, how: Save) {
    let dir = TestDir::new(name);
    let daemon = daemon_under_test();
    let locks = daemon == DaemonKind::Vfsd;
    // libvirt runs the daemon from a path of its own; the share holds the guest's lock
    // tool, static (the initramfs has no libc).
    let binary = dir.path.join("daemon");
    let source = match daemon {
        DaemonKind::Virtiofsd => crate::fixture::daemon::virtiofsd_bin(),
        _ => crate::fixture::vfsd_bin(),
    };
    std::fs::copy(&source, &binary).unwrap();
    let share = dir.dir("share");
    let lv = share.join("lv");
    std::fs::create_dir_all(&lv).unwrap();
    crate::fixture::build_lock_tool(&lv.join("vfsd-lock"), true);
    if locks {
        std::fs::write(lv.join("hold-locks"), "").unwrap();
    }
    let domain = format!(
        "vfsd-test-{}-{}",
        std::process::id(),
        if how == Save::ToFile { "save" } else { "msave" }
    );
    let console = dir.path.join("console.log");
    let xml = dir.path.join("domain.xml");
    std::fs::write(&xml, domain_xml(&domain, &binary, &share, &console, locks)).unwrap();
    let _slot = Slot::take(1);
    let _guard = Domain(domain.clone());
    let xml_s = xml.to_string_lossy().into_owned();
    match how {
        Save::ToFile => virsh_ok("create", &["create", "--validate", &xml_s]),
        Save::Managed => {
            virsh_ok("define", &["define", "--validate", &xml_s]);
            virsh_ok("start", &["start", &domain]);
        }
    }
    assert!(
        wait_file(&lv.join("guest.ready"), 300, &domain),
        "the guest did not come up:\n{}",
        std::fs::read_to_string(&console).unwrap_or_default()
    );
    let ino0 =
        std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(lv.join("data.log")).unwrap());
    if locks {
        let (held, how_seen) = host_sees_locks(&lv);
        assert!(
            held,
            "the guest's locks are not seen on the host before the save: {how_seen}"
        );
    }
    let state = dir.path.join("state.sav");
    let state_s = state.to_string_lossy().into_owned();
    let t = Instant::now();
    match how {
        Save::ToFile => virsh_ok("save", &["save", &domain, &state_s]),
        Save::Managed => virsh_ok("managedsave", &["managedsave", &domain]),
    }
    let saved_in = t.elapsed();
    let n0 = lines_in_order(&lv.join("data.log")).expect("data.log in order before the restore");
    match how {
        Save::ToFile => assert!(
            !virsh(&["domstate", &domain]).status.success(),
            "the domain is still there after virsh save"
        ),
        Save::Managed => {
            let info = String::from_utf8_lossy(&virsh(&["dominfo", &domain]).stdout).into_owned();
            assert!(
                info.lines()
                    .any(|l| l.starts_with("Managed save:") && l.ends_with("yes")),
                "no managed save after virsh managedsave:\n{info}"
            );
        }
    }
    std::thread::sleep(Duration::from_secs(2));
    let t = Instant::now();
    match how {
        Save::ToFile => virsh_ok("restore", &["restore", &state_s]),
        Save::Managed => virsh_ok("start", &["start", &domain]),
    }
    let restored_in = t.elapsed();
    if locks {
        let (held, how_seen) = host_sees_locks(&lv);
        assert!(
            held,
            "the guest's locks are gone on the host after the restore: {how_seen}"
        );
        std::fs::write(lv.join("release"), "").unwrap();
    }
    std::fs::write(lv.join("host.restored"), "").unwrap();
    assert!(
        wait_file(&lv.join("guest.result"), 300, &domain),
        "no guest result after the restore:\n{}",
        std::fs::read_to_string(&console).unwrap_or_default()
    );
    let result = std::fs::read_to_string(lv.join("guest.result")).unwrap();
    let ino1 =
        std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(lv.join("data.log")).unwrap());
    let n1 = lines_in_order(&lv.join("data.log"));
    let figures = format!(
        "{}: {:.1} s, restore {:.1} s, {n0} lines before, {} after; guest: {}",
        if how == Save::ToFile {
            "virsh save"
        } else {
            "virsh managedsave"
        },
        saved_in.as_secs_f64(),
        restored_in.as_secs_f64(),
        n1.map_or("not in order".to_string(), |n| n.to_string()),
        result.trim()
    );
    crate::fixture::summarize(name, &figures);
    assert!(
        result.starts_with("PASS"),
        "the guest after the restore: {result}\n{}",
        std::fs::read_to_string(&console).unwrap_or_default()
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
