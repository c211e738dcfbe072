//! `--metrics ADDR`: the daemon's counters in the Prometheus text format, over HTTP on a
//! unix socket or a loopback TCP port.
//!
//! The endpoint is one thread inside the sandbox, under the same seccomp filter as the rest
//! (the syscalls it makes are ones request serving makes too). It reads the same counters
//! `--stats` dumps, at most ten times a second (a scrape sooner after the last one waits
//! its turn), so serving requests never waits on it. Up to `MAX_CONNECTIONS` connections
//! are served at once, each on a thread of its own; a scraper gets 1 s for its request
//! head and 2 s for its whole exchange (the reply's writes included), at most 8 KiB of
//! request head, and no request body is ever read. A connection past the bound takes the
//! place of the oldest one still waiting for its head (or, if none waits, is closed):
//! idle connections a local user holds can't keep a scraper that sends its request at
//! once from being served. docs/metrics.md lists the metrics.

use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use log::{debug, warn};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeGaugeValue, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::device::{FsDevice, MIGRATION_STATES};
use crate::stats::{errno_label, opcode_label, Stats, LATENCY_BOUNDS_S};

/// How long one scrape may take, from its connection to the last byte of the reply.
const DEADLINE: Duration = Duration::from_secs(2);
/// How long a connection may take to send its request head, from its accept: a scraper
/// sends it at once.
const HEAD_DEADLINE: Duration = Duration::from_secs(1);
/// Connections served at once, each on a thread of its own.
const MAX_CONNECTIONS: usize = 8;
/// The most of a request head read; a longer one is answered 431.
const MAX_HEAD: usize = 8192;

/// Where `--metrics` listens.
#[derive(Debug, PartialEq)]
pub enum MetricsAddr {
    Unix(PathBuf),
    Tcp(Vec<SocketAddr>),
}

/// Why `--metrics` can't be served where it says.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// Something is at the socket's path that must stay.
    #[error("--metrics '{}': {why}", .path.display())]
    Occupied { path: PathBuf, why: String },
    /// A stale socket there could not be removed.
    #[error("--metrics '{}'", .path.display())]
    Stale {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("--metrics '{}': cannot listen", .path.display())]
    ListenUnix {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("--metrics {addr}: cannot listen")]
    ListenTcp {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("--metrics-fd")]
    Fd(#[source] io::Error),
}

/// Parses `--metrics`: a unix socket path (any value with a `/`: `./metrics.sock` for one
/// in the working directory), or else a loopback `host:port`. A value parser: the message
/// says all.
pub fn parse_addr(s: &str) -> Result<MetricsAddr, String> {
    if s.contains('/') {
        return Ok(MetricsAddr::Unix(PathBuf::from(s)));
    }
    let usage = "give a unix socket path (with a '/') or a loopback host:port";
    let Some((host, port)) = s.rsplit_once(':') else {
        return Err(format!("--metrics '{s}': {usage}"));
    };
    if host.is_empty() || port.parse::<u16>().is_err() {
        return Err(format!(
            "--metrics '{s}': {usage} (an empty host would mean every interface)"
        ));
    }
    let addrs: Vec<SocketAddr> = s
        .to_socket_addrs()
        .map_err(|e| format!("--metrics '{s}': {e}"))?
        .collect();
    if addrs.is_empty() || addrs.iter().any(|a| !a.ip().is_loopback()) {
        return Err(format!(
            "--metrics '{s}': only a loopback address (127.0.0.1:PORT, [::1]:PORT, localhost:PORT) or a unix socket path: the metrics show every guest request's kind and errors"
        ));
    }
    Ok(MetricsAddr::Tcp(addrs))
}

/// The bound endpoint, not yet served.
pub enum MetricsListener {
    Unix(UnixListener),
    Tcp(TcpListener),
}

impl MetricsListener {
    /// Binds `addr`. A unix path another process listens on is refused; a stale socket
    /// there is replaced; anything else there is refused.
    pub fn bind(addr: &MetricsAddr) -> Result<Self, MetricsError> {
        match addr {
            MetricsAddr::Unix(p) => bind_unix(p).map(MetricsListener::Unix),
            MetricsAddr::Tcp(a) => {
                let l = TcpListener::bind(&a[..])
                    .map_err(|source| MetricsError::ListenTcp { addr: a[0], source })?;
                if let Ok(at) = l.local_addr() {
                    log::info!("metrics on http://{at}/metrics");
                }
                Ok(MetricsListener::Tcp(l))
            }
        }
    }

    /// The listener the supervisor bound (`--metrics-fd`): a unix or a TCP socket, as its
    /// address family says.
    pub fn from_fd(fd: std::os::fd::OwnedFd) -> Result<Self, MetricsError> {
        use std::os::fd::AsRawFd;
        let mut domain: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: getsockopt writes an int into `domain`, whose size `len` gives.
        let r = unsafe {
            libc::getsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_DOMAIN,
                (&mut domain as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        if r != 0 {
            return Err(MetricsError::Fd(io::Error::last_os_error()));
        }
        Ok(match domain {
            libc::AF_UNIX => MetricsListener::Unix(UnixListener::from(fd)),
            _ => MetricsListener::Tcp(TcpListener::from(fd)),
        })
    }

    pub fn fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        match self {
            MetricsListener::Unix(l) => l.as_raw_fd(),
            MetricsListener::Tcp(l) => l.as_raw_fd(),
        }
    }

    /// Serves scrapes for as long as the process lives: a thread accepts, and each
    /// connection is served on a thread of its own, up to `MAX_CONNECTIONS`.
    pub fn spawn(self, device: Arc<FsDevice>) -> io::Result<()> {
        let endpoint = Arc::new(Endpoint {
            device,
            last_reading: Mutex::new(None),
            conns: Mutex::new(Vec::new()),
        });
        std::thread::Builder::new()
            .name("vfsd-metrics".into())
            .spawn(move || {
                let mut next_id = 0u64;
                loop {
                    let accepted = match &self {
                        MetricsListener::Unix(l) => {
                            l.accept().map(|(c, _)| Box::new(c) as Box<dyn Conn>)
                        }
                        MetricsListener::Tcp(l) => {
                            l.accept().map(|(c, _)| Box::new(c) as Box<dyn Conn>)
                        }
                    };
                    match accepted {
                        Ok(c) => {
                            next_id += 1;
                            endpoint.clone().take(c, next_id);
                        }
                        Err(e) => {
                            // Out of fds, say: try again a little later rather than spin.
                            warn!("metrics endpoint: accept: {e}");
                            std::thread::sleep(Duration::from_millis(100));
                        }
                    }
                }
            })
            .map(drop)
    }
}

/// A connection being served.
struct Slot {
    id: u64,
    fd: RawFd,
    accepted: Instant,
    /// Its request head has come whole: it is being answered.
    answering: bool,
}

/// A connection waiting for its request head keeps its place for at least this long.
const YOUNGEST_EVICTED: Duration = Duration::from_millis(200);

/// What the connections' threads share.
struct Endpoint {
    device: Arc<FsDevice>,
    /// When the counters were last read (`paced_render`).
    last_reading: Mutex<Option<Instant>>,
    /// The connections being served. A connection's fd is closed only with this lock
    /// held and its slot removed, so the fd of a slot found here is that connection's.
    conns: Mutex<Vec<Slot>>,
}

impl Endpoint {
    /// Serves `conn` on a thread of its own, in a free place or in that of the oldest
    /// connection still waiting for its request head after `YOUNGEST_EVICTED` (shut down,
    /// so its thread lets it go); with neither, `conn` is closed at once.
    fn take(self: Arc<Self>, conn: Box<dyn Conn>, id: u64) {
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        if conns.len() >= MAX_CONNECTIONS {
            // Not one younger than `YOUNGEST_EVICTED`: a flood of connects must not push
            // out a scraper in the moment between its connect and its request head.
            let waiting = (conns.iter())
                .filter(|s| !s.answering && s.accepted.elapsed() >= YOUNGEST_EVICTED)
                .min_by_key(|s| s.accepted);
            let Some(oldest) = waiting else {
                debug!(
                    "metrics endpoint: {MAX_CONNECTIONS} scrapes being answered; connection closed"
                );
                return;
            };
            // SAFETY: the fd is the oldest connection's, open while its slot is listed
            // and the lock held; shutdown only ends its exchange.
            unsafe { libc::shutdown(oldest.fd, libc::SHUT_RDWR) };
            let gone = oldest.id;
            conns.retain(|s| s.id != gone);
        }
        conns.push(Slot {
            id,
            fd: conn.fd(),
            accepted: Instant::now(),
            answering: false,
        });
        // Spawned with the lock held: if the spawn fails, the connection is closed (with
        // the closure) before its slot goes.
        let me = self.clone();
        let spawned = std::thread::Builder::new()
            .name("vfsd-metrics-conn".into())
            .stack_size(256 * 1024)
            .spawn(move || {
                let mut conn = conn;
                // A panic would leave the slot taken for good.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    serve(&mut *conn, &me, id)
                }));
                me.close(conn, id);
            });
        if let Err(e) = spawned {
            warn!("metrics endpoint: cannot start a thread: {e}");
            conns.retain(|s| s.id != id);
        }
    }

    /// Notes that connection `id` sent its head whole; false if it lost its place.
    fn answering(&self, id: u64) -> bool {
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        match conns.iter_mut().find(|s| s.id == id) {
            Some(s) => {
                s.answering = true;
                true
            }
            None => false,
        }
    }

    /// Closes connection `id` and frees its place, under the lock (see `conns`).
    fn close(&self, conn: Box<dyn Conn>, id: u64) {
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        conns.retain(|s| s.id != id);
        drop(conn);
    }
}

/// The least time between two readings of the counters: however many scrapers there
/// are, the endpoint reads the counters (and counts the open fds) at most ten times a
/// second. A scrape that comes sooner waits; its body is fresh all the same.
const MIN_INTERVAL: Duration = Duration::from_millis(100);

/// `render`, at least `MIN_INTERVAL` after the last reading. One reading at a time: the
/// others wait their turn.
fn paced_render(endpoint: &Endpoint) -> String {
    let mut last = (endpoint.last_reading.lock()).unwrap_or_else(|e| e.into_inner());
    if let Some(at) = *last {
        std::thread::sleep(MIN_INTERVAL.saturating_sub(at.elapsed()));
    }
    *last = Some(Instant::now());
    render(&endpoint.device)
}

/// Binds the unix socket `p`, readable by its owner only (the metrics describe the
/// guest's activity). A socket already there is replaced only if it is stale: a stream
/// connect to it is refused. Anything else there is refused.
///
/// The socket file is made with mode 0600 by the bind itself, under a umask of 0177 set
/// for it: it is never more open than that, and never chmod'ed by path (which would
/// follow a symlink put in its place). Start-up has no other thread yet, so no file of
/// another thread is made under that umask.
fn bind_unix(p: &Path) -> Result<UnixListener, MetricsError> {
    use std::os::unix::fs::FileTypeExt;
    let occupied = |why: String| MetricsError::Occupied {
        path: p.to_path_buf(),
        why,
    };
    match std::fs::symlink_metadata(p) {
        Ok(m) if m.file_type().is_socket() => match UnixStream::connect(p) {
            Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => std::fs::remove_file(p)
                .map_err(|source| MetricsError::Stale {
                    path: p.to_path_buf(),
                    source,
                })?,
            Ok(_) => return Err(occupied("in use by another process".into())),
            Err(e) => {
                return Err(occupied(format!(
                    "a socket in use or of another kind ({e})"
                )))
            }
        },
        Ok(_) => return Err(occupied("exists and is not a socket".into())),
        Err(_) => {}
    }
    // SAFETY: umask only swaps the process's file creation mask.
    let launchers = unsafe { libc::umask(0o177) };
    let bound = UnixListener::bind(p);
    // SAFETY: as above, putting the launcher's mask back.
    unsafe { libc::umask(launchers) };
    bound.map_err(|source| MetricsError::ListenUnix {
        path: p.to_path_buf(),
        source,
    })
}

/// A scraper's connection: a stream with timeouts.
trait Conn: Read + Write + Send {
    fn read_timeout(&self, d: Duration) -> io::Result<()>;
    fn write_timeout(&self, d: Duration) -> io::Result<()>;
    fn fd(&self) -> RawFd;
}

impl Conn for UnixStream {
    fn read_timeout(&self, d: Duration) -> io::Result<()> {
        self.set_read_timeout(Some(d))
    }
    fn write_timeout(&self, d: Duration) -> io::Result<()> {
        self.set_write_timeout(Some(d))
    }
    fn fd(&self) -> RawFd {
        self.as_raw_fd()
    }
}

impl Conn for TcpStream {
    fn read_timeout(&self, d: Duration) -> io::Result<()> {
        self.set_read_timeout(Some(d))
    }
    fn write_timeout(&self, d: Duration) -> io::Result<()> {
        self.set_write_timeout(Some(d))
    }
    fn fd(&self) -> RawFd {
        self.as_raw_fd()
    }
}

/// Reads one request head, answers it, and closes the connection (when the caller drops
/// it). `id` is its place among the connections served.
fn serve(conn: &mut dyn Conn, endpoint: &Endpoint, id: u64) {
    let start = Instant::now();
    let left_of = |limit: Duration| limit.checked_sub(start.elapsed()).filter(|d| !d.is_zero());
    let left = || left_of(DEADLINE);
    let mut buf = vec![0u8; MAX_HEAD];
    let mut n = 0;
    let reply = loop {
        let Some(d) = left_of(HEAD_DEADLINE) else {
            debug!("metrics endpoint: no request head within {HEAD_DEADLINE:?}");
            return;
        };
        if conn.read_timeout(d).is_err() {
            return;
        }
        match conn.read(&mut buf[n..]) {
            Ok(0) => return,
            Err(e) => {
                debug!("metrics endpoint: scraper dropped after {n} bytes: {e}");
                return;
            }
            Ok(k) => n += k,
        }
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&buf[..n]) {
            Ok(httparse::Status::Complete(_)) => {
                if !endpoint.answering(id) {
                    return;
                }
                break respond(req.method.unwrap_or(""), req.path.unwrap_or(""), endpoint);
            }
            Ok(httparse::Status::Partial) if n < MAX_HEAD => continue,
            Ok(httparse::Status::Partial) => break plain(431, "request head too long\n"),
            Err(e) => break plain(400, &format!("{e}\n")),
        }
    };
    // In pieces, each with what is left of the deadline: one write's timeout restarts
    // whenever the reader takes a little.
    for piece in reply.chunks(16 * 1024) {
        let Some(d) = left() else {
            debug!("metrics endpoint: scraper too slow to take the reply");
            return;
        };
        if conn.write_timeout(d).is_err() || conn.write_all(piece).is_err() {
            return;
        }
    }
}

/// The reply to `method path`.
fn respond(method: &str, path: &str, endpoint: &Endpoint) -> Vec<u8> {
    let path = path.split('?').next().unwrap_or("");
    if path != "/metrics" && path != "/" {
        return plain(404, "not found: the metrics are at /metrics\n");
    }
    let head_only = match method {
        "GET" => false,
        "HEAD" => true,
        _ => return plain(405, "only GET and HEAD\n"),
    };
    let body = paced_render(endpoint);
    let mut r = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
        body.len()
    )
    .into_bytes();
    if !head_only {
        r.extend_from_slice(body.as_bytes());
    }
    r
}

fn plain(code: u16, text: &str) -> Vec<u8> {
    let reason = match code {
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Request Header Fields Too Large",
    };
    let allow = if code == 405 {
        "Allow: GET, HEAD\r\n"
    } else {
        ""
    };
    format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n{allow}Connection: close\r\n\r\n{text}",
        text.len()
    )
    .into_bytes()
}

/// Every metric, in the Prometheus text format (0.0.4).
pub fn render(device: &Arc<FsDevice>) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Counters(device.clone())));
    let mut out = String::new();
    // Writing into a String can't fail, and neither can the collector.
    if let Err(e) = prometheus_client::encoding::prometheus_text::encode(&mut out, &registry) {
        let _ = writeln!(out, "# encoding failed: {e}");
    }
    out
}

/// Reads the counters when the registry encodes them: one registry per scrape.
struct Counters(Arc<FsDevice>);

impl std::fmt::Debug for Counters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("vfsd counters")
    }
}

type Enc<'a> = DescriptorEncoder<'a>;

fn counter(enc: &mut Enc, name: &str, help: &str, v: u64) -> std::fmt::Result {
    enc.encode_descriptor(name, help, None, MetricType::Counter)?
        .encode_counter::<NoLabelSet, _, u64>(&v, None)
}

fn gauge(enc: &mut Enc, name: &str, help: &str, v: impl EncodeGaugeValue) -> std::fmt::Result {
    enc.encode_descriptor(name, help, None, MetricType::Gauge)?
        .encode_gauge(&v)
}

fn requests(enc: &mut Enc, stats: &Stats) -> std::fmt::Result {
    let ops: Vec<_> = Stats::opcodes()
        .filter_map(|op| Some((op, opcode_label(op), stats.op(op)?)))
        .collect();
    let mut m = enc.encode_descriptor(
        "vfsd_requests",
        "FUSE requests served, by opcode.",
        None,
        MetricType::Counter,
    )?;
    for (_, name, s) in &ops {
        m.encode_family(&[("opcode", name.as_str())])?
            .encode_counter::<NoLabelSet, _, u64>(&s.count, None)?;
    }
    let mut m = enc.encode_descriptor(
        "vfsd_request_errors",
        "FUSE requests answered with an error, by opcode and errno.",
        None,
        MetricType::Counter,
    )?;
    for (op, name, _) in &ops {
        for (e, n) in stats.errnos(*op) {
            m.encode_family(&[("opcode", name.as_str()), ("errno", &errno_label(e))])?
                .encode_counter::<NoLabelSet, _, u64>(&n, None)?;
        }
    }
    let mut m = enc.encode_descriptor(
        "vfsd_malformed_requests",
        "FUSE requests that were malformed (answered with an errno, or dropped), by opcode.",
        None,
        MetricType::Counter,
    )?;
    for (_, name, s) in &ops {
        if s.malformed > 0 {
            m.encode_family(&[("opcode", name.as_str())])?
                .encode_counter::<NoLabelSet, _, u64>(&s.malformed, None)?;
        }
    }
    let mut m = enc.encode_descriptor(
        "vfsd_request_duration_seconds",
        "Time from a request's decoding to its reply (for a SETLKW that waits, to its hand-off to a waiter thread), by opcode.",
        None,
        MetricType::Histogram,
    )?;
    for (_, name, s) in &ops {
        let buckets: Vec<(f64, u64)> = (LATENCY_BOUNDS_S.iter().copied())
            .chain([f64::INFINITY])
            .zip(s.buckets)
            .collect();
        m.encode_family(&[("opcode", name.as_str())])?
            .encode_histogram::<NoLabelSet>(s.total_s, s.count, &buckets, None)?;
    }
    Ok(())
}

impl Collector for Counters {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let device = &self.0;
        let server = device.server();
        let stats = server.stats();
        let load = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        requests(&mut enc, stats)?;
        counter(
            &mut enc,
            "vfsd_read_bytes",
            "Data bytes read by the guest (READ replies).",
            load(&stats.bytes_read),
        )?;
        counter(
            &mut enc,
            "vfsd_written_bytes",
            "Data bytes written by the guest (WRITE replies).",
            load(&stats.bytes_written),
        )?;
        counter(
            &mut enc,
            "vfsd_request_panics",
            "Requests whose handler panicked (answered EIO).",
            load(&stats.panics),
        )?;
        counter(
            &mut enc,
            "vfsd_fds_exhausted",
            "Requests answered EMFILE or ENFILE: the host's fd limits were reached.",
            load(&stats.fds_exhausted),
        )?;

        let q = device.queue_gauges();
        let mut m = enc.encode_descriptor(
            "vfsd_requests_in_flight",
            "Requests popped from a queue and not yet answered, lock waits included (queue 0 is the high-priority queue).",
            None,
            MetricType::Gauge,
        )?;
        for (queue, n) in &q.in_flight {
            m.encode_family(&[("queue", queue.to_string())])?
                .encode_gauge(&(*n as i64))?;
        }
        gauge(
            &mut enc,
            "vfsd_worker_pool_queued_requests",
            "Requests handed to the worker pool that no worker has taken yet.",
            q.pool_queued as i64,
        )?;
        gauge(
            &mut enc,
            "vfsd_worker_pool_threads",
            "Worker threads (--thread-pool-size; 0: each queue thread serves its own).",
            q.pool_threads as i64,
        )?;

        let fs = server.fs().gauges();
        gauge(
            &mut enc,
            "vfsd_inodes",
            "Inodes the guest knows (looked up and not forgotten).",
            fs.live_inodes as i64,
        )?;
        gauge(
            &mut enc,
            "vfsd_inode_fds",
            "O_PATH fds the inodes hold.",
            fs.inode_fds as i64,
        )?;
        gauge(
            &mut enc,
            "vfsd_inode_fds_limit",
            "The bound on O_PATH fds the inodes hold.",
            fs.inode_fd_limit as i64,
        )?;
        gauge(
            &mut enc,
            "vfsd_open_handles",
            "File and directory handles open for the guest.",
            fs.open_handles as i64,
        )?;
        gauge(
            &mut enc,
            "vfsd_locks_held",
            "POSIX lock and flock ranges the guest holds.",
            fs.locks_held as i64,
        )?;
        gauge(
            &mut enc,
            "vfsd_lock_waiters",
            "SETLKW requests waiting for a lock.",
            fs.lock_waiters as i64,
        )?;
        gauge(
            &mut enc,
            "vfsd_lock_owners",
            "Lock owners, each with a host open file description.",
            fs.lock_owners as i64,
        )?;
        counter(
            &mut enc,
            "vfsd_lock_enolck",
            "Lock requests answered ENOLCK (a lock bound was reached).",
            fs.lock_enolck,
        )?;
        counter(
            &mut enc,
            "vfsd_lock_edeadlk",
            "SETLKW requests answered EDEADLK (a cycle of waits).",
            fs.lock_edeadlk,
        )?;
        counter(
            &mut enc,
            "vfsd_lock_stalled",
            "SETLKW requests answered EDEADLK (every guest holder in the way stalled).",
            fs.lock_stalled,
        )?;

        let mig = device.migration_stats().snapshot();
        let mut m = enc.encode_descriptor(
            "vfsd_migration_state",
            "The device-state transfer's state: 1 for the current one.",
            None,
            MetricType::Gauge,
        )?;
        for s in MIGRATION_STATES {
            m.encode_family(&[("state", s)])?
                .encode_gauge(&i64::from(s == mig.state))?;
        }
        gauge(
            &mut enc,
            "vfsd_migration_last_state_bytes",
            "The last finished device-state transfer's size.",
            mig.last_bytes as i64,
        )?;
        gauge(
            &mut enc,
            "vfsd_migration_last_duration_seconds",
            "How long the last finished device-state transfer took.",
            mig.last_duration_s,
        )?;
        let mut m = enc.encode_descriptor(
            "vfsd_migration_transfers",
            "Device-state transfers, by direction and result.",
            None,
            MetricType::Counter,
        )?;
        for (dir, result, n) in [
            ("save", "ok", mig.saved),
            ("save", "failed", mig.failed_saves),
            ("load", "ok", mig.loaded),
            ("load", "failed", mig.failed_loads),
        ] {
            m.encode_family(&[("direction", dir), ("result", result)])?
                .encode_counter::<NoLabelSet, _, u64>(&n, None)?;
        }

        let (fds, rss) = server.fs().process_gauges();
        if let Some(n) = fds {
            gauge(
                &mut enc,
                "process_open_fds",
                &format!(
                    "Open file descriptors (left out on a kernel before 6.2 when over {}: there they are counted one by one).",
                    crate::passthrough::OPEN_FDS_COUNTED
                ),
                n as i64,
            )?;
        }
        gauge(
            &mut enc,
            "process_max_fds",
            "The soft limit on open file descriptors.",
            crate::sys::nofile_limit().min(i64::MAX as u64) as i64,
        )?;
        if let Some(b) = rss {
            gauge(
                &mut enc,
                "process_resident_memory_bytes",
                "Resident memory size.",
                b.min(i64::MAX as u64) as i64,
            )?;
        }
        gauge(
            &mut enc,
            "vfsd_uptime_seconds",
            "Time since the daemon (under --keep-listening, this frontend's child) started.",
            stats.uptime().as_secs_f64(),
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_with_a_slash_are_paths_and_the_rest_loopback_host_port() {
        let unix = |p: &str| MetricsAddr::Unix(PathBuf::from(p));
        assert_eq!(parse_addr("/run/vfsd/m.sock"), Ok(unix("/run/vfsd/m.sock")));
        assert_eq!(parse_addr("./m:1"), Ok(unix("./m:1")));
        let tcp = |s: &str| matches!(parse_addr(s), Ok(MetricsAddr::Tcp(a)) if a.iter().all(|a| a.ip().is_loopback()));
        assert!(tcp("127.0.0.1:9100"));
        assert!(tcp("[::1]:9100"));
        assert!(tcp("localhost:9100"));
        for bad in [
            ":9100",
            "m.sock",
            "[::1]",
            "localhost",
            "127.0.0.1:x",
            "127.0.0.1:70000",
            "",
        ] {
            let e = parse_addr(bad).unwrap_err();
            assert!(e.contains("unix socket path"), "{bad}: {e}");
        }
        for open in ["0.0.0.0:9100", "[::]:9100", "192.0.2.1:9100"] {
            let e = parse_addr(open).unwrap_err();
            assert!(e.contains("only a loopback address"), "{open}: {e}");
        }
    }
}
