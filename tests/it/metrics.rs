//! `--metrics`: the Prometheus endpoint, scraped over its unix socket and a loopback port
//! while requests go through the real socket and virtqueues; its counters checked against
//! what was sent, and a stalling or flooding scraper against the request path.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common::{run_vfsd, Daemon, ROOT};
use vfsd::frontend::fuse::*;

/// A daemon with `--metrics` on a socket in a directory of its own (kept as long as the
/// daemon: dropped after it).
fn start(extra: &[&str]) -> (Daemon, PathBuf, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("metrics.sock");
    let mut args = vec!["--metrics", path.to_str().unwrap()];
    args.extend_from_slice(extra);
    (Daemon::start(&args), path, dir)
}

/// One HTTP exchange: the raw response (head and body).
fn exchange(mut s: impl Read + Write, request: &[u8]) -> String {
    s.write_all(request).unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    String::from_utf8(out).unwrap()
}

fn scrape(path: &Path) -> Metrics {
    let s = UnixStream::connect(path).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    parse(&exchange(s, b"GET /metrics HTTP/1.1\r\nHost: vfsd\r\n\r\n"))
}

/// The samples of a 200 response, read by a Prometheus text parser: `name{labels}` (the
/// labels sorted by name) to value; a histogram's buckets under its name as
/// `name{labels}` in `buckets`.
fn parse(response: &str) -> Metrics {
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    let lines = body.lines().map(|l| Ok(l.to_string()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("the Prometheus text format");
    let mut m = Metrics::default();
    for s in scrape.samples {
        let mut labels: Vec<_> = s
            .labels
            .iter()
            .map(|(k, v)| format!("{k}=\"{v}\""))
            .collect();
        labels.sort();
        let key = match labels.is_empty() {
            true => s.metric.clone(),
            false => format!("{}{{{}}}", s.metric, labels.join(",")),
        };
        use prometheus_parse::Value::*;
        match s.value {
            Counter(v) | Gauge(v) | Untyped(v) => {
                m.values.insert(key, v);
            }
            Histogram(b) => {
                let b = b.iter().map(|c| (c.less_than, c.count)).collect();
                m.buckets.insert(key, b);
            }
            Summary(_) => panic!("vfsd exports no summaries: {key}"),
        }
    }
    assert!(!m.values.is_empty(), "no samples in {body:.200}");
    m
}

#[derive(Default, Debug)]
struct Metrics {
    values: HashMap<String, f64>,
    buckets: HashMap<String, Vec<(f64, f64)>>,
}

impl Metrics {
    fn contains_key(&self, key: &str) -> bool {
        self.values.contains_key(key)
    }
}

fn get(m: &Metrics, key: &str) -> f64 {
    *m.values.get(key).unwrap_or_else(|| {
        panic!(
            "no sample {key} in {:?}",
            m.values.keys().collect::<Vec<_>>()
        )
    })
}

/// What the client sent comes back counted: requests and errnos per opcode, the
/// latency histogram's count, bytes both ways, open handles; and the JSON of `--stats`
/// agrees, from the same counters.
#[test]
fn metrics_count_requests_errnos_latency_and_bytes_as_the_guest_sent_them() {
    let (d, path, _dir) = start(&[]);
    let c = d.client();
    // A missing name is a negative entry, not an error reply: UNLINK answers ENOENT.
    assert_eq!(
        c.lookup(ROOT, "missing").unwrap_err().errno(),
        Some(libc::ENOENT)
    );
    for _ in 0..3 {
        assert_eq!(
            c.unlink(ROOT, "missing").unwrap_err().errno(),
            Some(libc::ENOENT)
        );
    }
    let (e, o) = c
        .create(ROOT, "f", libc::O_RDWR as u32, 0o644)
        .expect("CREATE");
    let data = vec![7u8; 5000];
    assert_eq!(c.write(e.nodeid, o.fh, 0, &data).unwrap(), 5000);
    assert_eq!(c.read(e.nodeid, o.fh, 0, 8192).unwrap().len(), 5000);
    assert_eq!(c.read(e.nodeid, o.fh, 1000, 8192).unwrap().len(), 4000);

    let m = scrape(&path);
    assert_eq!(get(&m, r#"vfsd_requests_total{opcode="lookup"}"#), 1.0);
    assert!(!m.contains_key(r#"vfsd_request_errors_total{errno="ENOENT",opcode="lookup"}"#));
    assert_eq!(get(&m, r#"vfsd_requests_total{opcode="unlink"}"#), 3.0);
    assert_eq!(
        get(
            &m,
            r#"vfsd_request_errors_total{errno="ENOENT",opcode="unlink"}"#
        ),
        3.0
    );
    assert_eq!(get(&m, r#"vfsd_requests_total{opcode="create"}"#), 1.0);
    assert!(!m.contains_key(r#"vfsd_request_errors_total{errno="ENOENT",opcode="create"}"#));
    assert_eq!(get(&m, r#"vfsd_requests_total{opcode="read"}"#), 2.0);
    assert_eq!(
        get(
            &m,
            r#"vfsd_request_duration_seconds_count{opcode="unlink"}"#
        ),
        3.0
    );
    // Cumulative buckets that never fall, up to +Inf holding every request.
    let unlinks = &m.buckets[r#"vfsd_request_duration_seconds{opcode="unlink"}"#];
    assert_eq!(unlinks.len(), 13, "{unlinks:?}");
    assert_eq!(*unlinks.last().unwrap(), (f64::INFINITY, 3.0));
    assert!(
        unlinks
            .windows(2)
            .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1),
        "{unlinks:?}"
    );
    assert!(get(&m, r#"vfsd_request_duration_seconds_sum{opcode="unlink"}"#) > 0.0);
    assert_eq!(get(&m, "vfsd_written_bytes_total"), 5000.0);
    assert_eq!(get(&m, "vfsd_read_bytes_total"), 9000.0);
    assert_eq!(get(&m, "vfsd_open_handles"), 1.0);
    assert!(get(&m, "vfsd_inodes") >= 2.0);
    assert!(get(&m, "vfsd_inode_fds_limit") >= get(&m, "vfsd_inode_fds"));
    assert_eq!(get(&m, r#"vfsd_requests_in_flight{queue="1"}"#), 0.0);
    assert_eq!(get(&m, r#"vfsd_migration_state{state="none"}"#), 1.0);
    assert!(get(&m, "process_open_fds") >= 5.0);
    assert!(get(&m, "process_resident_memory_bytes") > 1e6);

    let st = d.stats();
    assert_eq!(st["bytes_written"], 5000);
    assert_eq!(st["bytes_read"], 9000);
    assert_eq!(st["opcodes"]["UNLINK"]["errnos"]["ENOENT"], 3);
    assert_eq!(st["opcodes"]["UNLINK"]["count"], 3);
}

/// A SETLKW that waits shows as a request in flight on its queue and a lock waiter,
/// beside the lock it waits for; answered, both go back to 0.
#[test]
fn a_waiting_setlkw_shows_in_flight_and_as_a_lock_waiter() {
    let (d, path, _dir) = start(&[]);
    std::fs::write(d.path("f"), b"x").unwrap();
    let c = d.client();
    let n = c.lookup(ROOT, "f").unwrap().nodeid;
    let fh = c.open(n, libc::O_RDWR as u32).unwrap().fh;
    let wr = |pid| Lock::range(0, 0, libc::F_WRLCK, pid);
    c.setlk(n, fh, 0xa, wr(1)).unwrap();
    let t = c.setlkw(1, n, fh, 0xb, wr(2)).unwrap();
    let start = Instant::now();
    let m = loop {
        let m = scrape(&path);
        if get(&m, "vfsd_lock_waiters") == 1.0 {
            break m;
        }
        assert!(start.elapsed() < Duration::from_secs(5), "no waiter: {m:?}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(get(&m, r#"vfsd_requests_in_flight{queue="1"}"#), 1.0);
    assert_eq!(get(&m, "vfsd_locks_held"), 1.0);
    // The holder and the waiter each have their host open file description.
    assert_eq!(get(&m, "vfsd_lock_owners"), 2.0);
    c.setlk(n, fh, 0xa, Lock::range(0, 0, libc::F_UNLCK, 0))
        .unwrap();
    assert_eq!(c.wait(t).unwrap().error, 0);
    let m = scrape(&path);
    assert_eq!(get(&m, "vfsd_lock_waiters"), 0.0);
    assert_eq!(get(&m, r#"vfsd_requests_in_flight{queue="1"}"#), 0.0);
}

/// Scrapers that connect and send nothing, or trickle their request a byte at a time,
/// or send an endless head, hold the endpoint for at most its 2 s deadline each and are
/// cut off; the client's GETATTRs are answered all the while, none of them slowly (the
/// bound is gross: a request that waited on the endpoint would wait seconds).
#[test]
fn a_stalling_or_oversized_scraper_is_cut_off_and_delays_no_request() {
    let (d, path, _dir) = start(&[]);
    let c = d.client();
    // One that trickles (first in line, so its request never arrives whole within its
    // deadline), then two that send nothing, queued behind it.
    let trickle = {
        let mut s = UnixStream::connect(&path).unwrap();
        std::thread::spawn(move || {
            for b in b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
                .iter()
                .cycle()
                .take(60)
            {
                if s.write_all(&[*b]).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            s
        })
    };
    let mut idle: Vec<UnixStream> = (0..2)
        .map(|_| UnixStream::connect(&path).unwrap())
        .collect();
    let start = Instant::now();
    let (mut served, mut worst) = (0, Duration::ZERO);
    while start.elapsed() < Duration::from_millis(2500) {
        let t = Instant::now();
        c.getattr(ROOT).unwrap();
        worst = worst.max(t.elapsed());
        served += 1;
    }
    assert!(
        served > 10,
        "{served} GETATTRs in 2.5 s beside stalled scrapers"
    );
    assert!(
        worst < Duration::from_millis(500),
        "a GETATTR took {worst:?}"
    );
    idle.push(trickle.join().unwrap());
    // Each idle connection is closed at its deadline without a reply.
    for mut s in idle {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut buf = Vec::new();
        assert_eq!(s.read_to_end(&mut buf).unwrap(), 0);
    }
    let waited = start.elapsed();
    assert!(
        waited < Duration::from_secs(9),
        "three idle scrapers held the endpoint for {waited:?}"
    );
    // A head longer than 8 KiB is refused, without reading on.
    let mut s = UnixStream::connect(&path).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let long = format!("GET /metrics HTTP/1.1\r\nX: {}\r\n", "a".repeat(9000));
    let _ = s.write_all(long.as_bytes());
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    assert!(out.starts_with("HTTP/1.1 431"), "{out:.80}");
    // Wrong path and method.
    let r = exchange(
        UnixStream::connect(&path).unwrap(),
        b"GET /x HTTP/1.1\r\n\r\n",
    );
    assert!(r.starts_with("HTTP/1.1 404"), "{r}");
    let r = exchange(
        UnixStream::connect(&path).unwrap(),
        b"POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc",
    );
    assert!(r.starts_with("HTTP/1.1 405"), "{r}");
    // A well-behaved scrape still works, and the requests were counted.
    let m = scrape(&path);
    assert!(get(&m, r#"vfsd_requests_total{opcode="getattr"}"#) >= served as f64);
}

/// A daemon serving its metrics on a free loopback port, and that port's address.
fn daemon_with_loopback_metrics() -> (Daemon, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    (Daemon::start(&["--metrics", &addr]), addr)
}

/// The loopback TCP form serves the same; a HEAD gets the head only.
#[test]
fn metrics_on_a_loopback_port() {
    let (d, addr) = daemon_with_loopback_metrics();
    // Kept: the daemon exits when its frontend goes.
    let c = d.client();
    c.getattr(ROOT).unwrap();
    let s = std::net::TcpStream::connect(&addr).unwrap();
    let m = parse(&exchange(s, b"GET /metrics HTTP/1.0\r\n\r\n"));
    assert_eq!(get(&m, r#"vfsd_requests_total{opcode="getattr"}"#), 1.0);
    let s = std::net::TcpStream::connect(&addr).unwrap();
    let r = exchange(s, b"HEAD /metrics HTTP/1.1\r\n\r\n");
    let (head, body) = r.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200") && body.is_empty(), "{r}");
}

/// The metrics socket is bound owner-only (docs/metrics.md: mode 0600) whatever the
/// launcher's umask, so it is never more open than that, not even between its bind and
/// a chmod: vfsd never changes its mode by path (a chmod there would follow a symlink
/// swapped in), and starts with every chmod refused.
#[test]
fn the_metrics_socket_is_owner_only_under_an_open_umask_with_no_chmod() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("metrics.sock");
    let chmods = [libc::SYS_chmod, libc::SYS_fchmodat, libc::SYS_fchmodat2];
    let d =
        Daemon::start_denied_under_umask(&chmods, Some(0), &["--metrics", path.to_str().unwrap()]);
    let c = d.client();
    c.getattr(ROOT).unwrap();
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::symlink_metadata(&path)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o600, "{mode:o}");
    let m = scrape(&path);
    assert_eq!(get(&m, r#"vfsd_requests_total{opcode="getattr"}"#), 1.0);
}

/// Idle connections to a loopback port (any local user can open them), more of them than
/// are served at once, don't keep a scrape waiting: connections are served side by side,
/// and one still waiting for its request gives way to a newer one.
#[test]
fn idle_connections_to_the_metrics_port_do_not_hold_up_a_scrape() {
    let (d, addr) = daemon_with_loopback_metrics();
    let c = d.client();
    c.getattr(ROOT).unwrap();
    let _idle: Vec<_> = (0..20)
        .map(|_| std::net::TcpStream::connect(&addr).unwrap())
        .collect();
    // Let the endpoint take them in first, and let them age past the time a connection
    // keeps its place.
    std::thread::sleep(Duration::from_millis(400));
    for round in 0..3 {
        let t = Instant::now();
        let s = std::net::TcpStream::connect(&addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let m = parse(&exchange(s, b"GET /metrics HTTP/1.1\r\nHost: vfsd\r\n\r\n"));
        let took = t.elapsed();
        assert_eq!(get(&m, r#"vfsd_requests_total{opcode="getattr"}"#), 1.0);
        assert!(
            took < Duration::from_secs(1),
            "scrape {round} beside 20 idle connections took {took:?}"
        );
    }
}

/// A flood of connects can't push out a scraper between its connect and its request:
/// a connection waiting for its head keeps its place for 200 ms, and the newcomers past
/// the 8 places are closed instead.
#[test]
fn a_flood_of_connects_does_not_push_out_a_scraper_that_just_connected() {
    let (d, addr) = daemon_with_loopback_metrics();
    let c = d.client();
    c.getattr(ROOT).unwrap();
    let scraper = std::net::TcpStream::connect(&addr).unwrap();
    scraper
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    // The scraper's place first, then the flood.
    std::thread::sleep(Duration::from_millis(20));
    let _flood: Vec<_> = (0..20)
        .map(|_| std::net::TcpStream::connect(&addr).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(50));
    let m = parse(&exchange(
        scraper,
        b"GET /metrics HTTP/1.1\r\nHost: vfsd\r\n\r\n",
    ));
    assert_eq!(get(&m, r#"vfsd_requests_total{opcode="getattr"}"#), 1.0);
}

/// Each wrong `--metrics` ends start-up with one line and a non-zero exit: a port open
/// to the network, a path that is no socket, a socket another daemon listens on.
#[test]
fn metrics_refuses_a_non_loopback_address_a_non_socket_and_a_socket_in_use() {
    let dir = tempfile::tempdir().unwrap();
    let share = dir.path().join("share");
    std::fs::create_dir(&share).unwrap();
    let sock = dir.path().join("v.sock");
    let run = |metrics: &str| {
        run_vfsd(&[
            "--socket-path",
            sock.to_str().unwrap(),
            "--shared-dir",
            share.to_str().unwrap(),
            "--metrics",
            metrics,
        ])
    };
    let (code, err) = run("0.0.0.0:9187");
    assert_eq!(code, Some(1));
    assert!(err.contains("only a loopback address"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    let file = dir.path().join("plain");
    std::fs::write(&file, b"").unwrap();
    let (code, err) = run(file.to_str().unwrap());
    assert_eq!(code, Some(1));
    assert!(err.contains("not a socket"), "{err}");
    assert!(file.exists());
    let busy = dir.path().join("busy.sock");
    let _l = std::os::unix::net::UnixListener::bind(&busy).unwrap();
    let (code, err) = run(busy.to_str().unwrap());
    assert_eq!(code, Some(1));
    assert!(err.contains("in use"), "{err}");
    assert!(busy.exists());
    // A datagram socket (a journal's, say) is never taken for a stale one.
    let dgram = dir.path().join("dgram.sock");
    let _g = std::os::unix::net::UnixDatagram::bind(&dgram).unwrap();
    let (code, err) = run(dgram.to_str().unwrap());
    assert_eq!(code, Some(1));
    assert!(err.contains("in use or of another kind"), "{err}");
    assert!(dgram.exists());
    // The vhost-user socket's own path, and a port without a host.
    let (code, err) = run(sock.to_str().unwrap());
    assert_eq!(code, Some(1));
    assert!(err.contains("the same socket"), "{err}");
    let (code, err) = run(":9187");
    assert_eq!(code, Some(1));
    assert!(err.contains("every interface"), "{err}");
    // A vhost-user socket in use fails start-up after the metrics socket was bound: it
    // goes again.
    let _v = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let m = dir.path().join("m.sock");
    let (code, err) = run(m.to_str().unwrap());
    assert_eq!(code, Some(1));
    assert!(err.contains("in use"), "{err}");
    assert!(!m.exists(), "the metrics socket outlived a failed start");
}

/// The endpoint's socket goes with the daemon, and a stale one is replaced.
#[test]
fn the_metrics_socket_is_removed_at_exit_and_a_stale_one_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.sock");
    // A stale socket: bound, then its listener gone.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(path.exists());
    let d = Daemon::start(&["--metrics", path.to_str().unwrap()]);
    assert!(scrape(&path).contains_key("vfsd_inodes"));
    drop(d);
    assert!(!path.exists(), "the metrics socket outlived the daemon");
}

/// A device-state save and loads (one refused, one good) show in the migration metrics
/// of each side: the state, the counts by result, the last state's size.
#[test]
fn migration_metrics_follow_a_save_and_a_refused_and_a_good_load() {
    let (src, src_metrics, _d1) = start(&[]);
    let c = src.client();
    let (e, o) = c.create(ROOT, "f", libc::O_RDWR as u32, 0o644).unwrap();
    c.write(e.nodeid, o.fh, 0, b"data").unwrap();
    let state = c.fe.save_state().unwrap();
    let m = scrape(&src_metrics);
    assert_transfer(&m, "saved", "save", "ok");
    assert_eq!(get(&m, r#"vfsd_migration_state{state="none"}"#), 0.0);
    assert_eq!(
        get(&m, "vfsd_migration_last_state_bytes"),
        state.len() as f64
    );
    assert!(get(&m, "vfsd_migration_last_duration_seconds") > 0.0);

    let dir = tempfile::tempdir().unwrap();
    let dst_metrics = dir.path().join("m.sock");
    let dst = Daemon::start_on(&src.share, &["--metrics", dst_metrics.to_str().unwrap()]);
    let fe = dst.frontend(vfsd::frontend::FrontendConfig::default());
    assert!(fe.load_state(&state[..state.len() / 2]).is_err());
    assert_transfer(&scrape(&dst_metrics), "failed", "load", "failed");
    fe.load_state(&state).unwrap();
    let m = scrape(&dst_metrics);
    assert_transfer(&m, "loaded", "load", "ok");
    assert_eq!(
        get(&m, "vfsd_migration_last_state_bytes"),
        state.len() as f64
    );
    assert_eq!(get(&m, "vfsd_open_handles"), 1.0);
}

/// The migration state is `state` alone, and one transfer of its kind was counted.
fn assert_transfer(m: &Metrics, state: &str, direction: &str, result: &str) {
    for s in ["none", "saving", "loading", "saved", "loaded", "failed"] {
        let want = if s == state { 1.0 } else { 0.0 };
        assert_eq!(
            get(m, &format!(r#"vfsd_migration_state{{state="{s}"}}"#)),
            want,
            "{s}"
        );
    }
    let key =
        format!(r#"vfsd_migration_transfers_total{{direction="{direction}",result="{result}"}}"#);
    assert_eq!(get(m, &key), 1.0);
}

/// Scrapes taken while a client sends GETATTRs see the count only rise, and the last
/// one, after the client is done, sees exactly what was sent.
#[test]
fn scrapes_during_a_workload_see_the_count_rise_to_the_requests_sent() {
    let (d, path, _dir) = start(&[]);
    let c = d.client();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let scraper = {
        let (path, done) = (path.clone(), done.clone());
        std::thread::spawn(move || {
            let mut seen = Vec::new();
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let m = scrape(&path);
                let key = r#"vfsd_requests_total{opcode="getattr"}"#;
                seen.push(m.values.get(key).copied().unwrap_or(0.0));
            }
            seen
        })
    };
    for _ in 0..3000 {
        c.getattr(ROOT).unwrap();
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let seen = scraper.join().unwrap();
    assert!(seen.len() >= 2, "{seen:?}");
    assert!(seen.windows(2).all(|w| w[0] <= w[1]), "{seen:?}");
    let m = scrape(&path);
    assert_eq!(get(&m, r#"vfsd_requests_total{opcode="getattr"}"#), 3000.0);
}

/// Opcodes FUSE doesn't define, sent by a hostile guest, are counted under one "other"
/// series: the number of series stays bounded, and no label set appears twice.
#[test]
fn undefined_opcodes_share_one_series_and_no_label_set_repeats() {
    let (d, path, _dir) = start(&[]);
    let c = d.client();
    for op in (53..=70).chain([4096, 0, u32::MAX]) {
        let r = c.call(op, ROOT, &[], 64);
        assert!(r.is_err() || r.is_ok(), "opcode {op} answered");
    }
    let s = UnixStream::connect(&path).unwrap();
    let text = exchange(s, b"GET /metrics HTTP/1.1\r\n\r\n");
    let body = text.split_once("\r\n\r\n").unwrap().1;
    let mut seen = std::collections::HashSet::new();
    for l in body.lines().filter(|l| !l.starts_with('#')) {
        let series = l.rsplit_once(' ').unwrap().0;
        assert!(seen.insert(series.to_string()), "{series} twice");
    }
    let m = parse(&text);
    assert_eq!(get(&m, r#"vfsd_requests_total{opcode="other"}"#), 21.0);
    assert_eq!(
        get(
            &m,
            r#"vfsd_request_errors_total{errno="ENOSYS",opcode="other"}"#
        ),
        21.0
    );
    let opcodes: std::collections::HashSet<_> = (m.values.keys())
        .filter_map(|k| k.strip_prefix("vfsd_requests_total{opcode=\""))
        .collect();
    assert_eq!(opcodes.len(), 2, "{opcodes:?}"); // init and other
}

/// Without a sandbox, and under --keep-listening (a child per frontend, its counters
/// from zero), the endpoint serves the same.
#[test]
fn metrics_without_a_sandbox_and_under_keep_listening() {
    for extra in [&["--sandbox", "none"][..], &["--keep-listening"][..]] {
        let (d, path, _dir) = start(extra);
        for round in 0..2 {
            let c = d.client();
            c.getattr(ROOT).unwrap();
            let m = scrape(&path);
            assert_eq!(
                get(&m, r#"vfsd_requests_total{opcode="getattr"}"#),
                1.0,
                "{extra:?}"
            );
            drop(c);
            if extra[0] == "--sandbox" || round == 1 {
                break;
            }
            // The next frontend's child, once the last one's is gone.
            std::thread::sleep(Duration::from_millis(300));
        }
    }
}
