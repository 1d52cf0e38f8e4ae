//! The trainer's side: the feed in its own thread ([`InProcessFeed`]) or from producer
//! processes ([`ProducerFeed`]), both [`DataSource`]s.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use candle_core::Device;
use serde::Serialize;

use super::config::{FeedConfig, FeedOptions, MAX_PRODUCERS};
use super::prep::{Prepared, Preprocessor};
use super::wire::{
    decode_batch, read_frame, write_frame, Fields, BATCH, CONFIG, FAILED, HELLO, READY, REQUEST,
};
use crate::error::EngineError;
use crate::models::data::{Batch, DataSource, Field};

/// The command that starts a producer: `program args… --socket PATH --worker I`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launcher {
    /// The executable.
    pub program: PathBuf,
    /// Its first arguments (the feed appends `--socket PATH --worker I`).
    pub args: Vec<OsString>,
}

impl Launcher {
    /// The running `mosaic` binary's hidden verb: `mosaic train produce`.
    pub fn mosaic() -> io::Result<Launcher> {
        Ok(Launcher {
            program: std::env::current_exe()?,
            args: vec!["train".into(), "produce".into()],
        })
    }
}

/// What one `batch` call cost.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct DataTiming {
    /// The data position.
    pub step: u64,
    /// Milliseconds the trainer's thread spent in `batch` (preparing in process; waiting for
    /// and converting the producer's batch otherwise).
    pub trainer_ms: f64,
    /// Milliseconds preparing the batch took where it ran.
    pub producer_ms: f64,
    /// Images decoded for the batch.
    pub images: u32,
}

/// The timings of a feed's `batch` calls, shared with whoever holds the feed.
#[derive(Debug, Default)]
pub struct FeedStats {
    timings: Mutex<Vec<DataTiming>>,
}

impl FeedStats {
    /// Every call so far, in order.
    pub fn timings(&self) -> Vec<DataTiming> {
        lock(&self.timings).clone()
    }

    fn record(&self, t: DataTiming) {
        lock(&self.timings).push(t);
    }
}

/// A lock that survives a panicked holder (the data stays consistent: every writer finishes
/// its update before anything can panic).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A feed ready to train on: the data source, its timings and the producers' process ids.
pub struct Feed {
    /// What the trainer reads (put it in `Model::data`).
    pub source: Box<dyn DataSource>,
    /// Its timings.
    pub stats: Arc<FeedStats>,
    /// The producer processes (none in process).
    pub pids: Vec<u32>,
}

/// The feed of `config` for a model with data `fields`: in the trainer's thread when
/// `producers` is 0, else from that many processes started by `launcher`.
pub fn feed(
    config: FeedConfig,
    fields: &[Field],
    producers: usize,
    launcher: &Launcher,
    options: FeedOptions,
) -> Result<Feed, EngineError> {
    if producers == 0 {
        let f = InProcessFeed::new(config, fields)?;
        return Ok(Feed {
            stats: f.stats(),
            pids: Vec::new(),
            source: Box::new(f),
        });
    }
    let f = ProducerFeed::spawn(launcher, config, fields, producers, options)?;
    Ok(Feed {
        stats: f.stats(),
        pids: f.pids(),
        source: Box::new(f),
    })
}

/// Preprocessing in the trainer's thread: the baseline of DistTrain's Fig. 21.
#[derive(Debug)]
pub struct InProcessFeed {
    pre: Preprocessor,
    fields: Vec<Field>,
    stats: Arc<FeedStats>,
}

impl InProcessFeed {
    /// Makes the raw data of `config` here; `fields` are the model's.
    pub fn new(config: FeedConfig, fields: &[Field]) -> Result<InProcessFeed, EngineError> {
        Ok(InProcessFeed {
            pre: Preprocessor::new(config)?,
            fields: fields.to_vec(),
            stats: Arc::default(),
        })
    }

    /// The timings of its `batch` calls.
    pub fn stats(&self) -> Arc<FeedStats> {
        Arc::clone(&self.stats)
    }

    /// The prepared batch of `step` (what `batch` turns into tensors).
    pub fn prepared(&self, step: u64, batch: usize) -> Result<Prepared, String> {
        self.pre.prepare(step, batch)
    }
}

impl DataSource for InProcessFeed {
    fn batch(&self, step: u64, batch: usize, device: &Device) -> candle_core::Result<Batch> {
        let t0 = Instant::now();
        let p = self
            .prepared(step, batch)
            .map_err(candle_core::Error::Msg)?;
        let b = p.to_batch(self.pre.config(), &self.fields, device)?;
        self.stats.record(DataTiming {
            step,
            trainer_ms: t0.elapsed().as_secs_f64() * 1e3,
            producer_ms: p.prep_ms,
            images: p.images(self.pre.config()),
        });
        Ok(b)
    }

    fn fields(&self) -> Vec<Field> {
        self.fields.clone()
    }
}

/// What the readers and the trainer share.
#[derive(Default)]
struct State {
    /// Batches arrived, by (step, samples): the reorder buffer.
    ready: BTreeMap<(u64, usize), Prepared>,
    /// Asked for and not yet taken.
    asked: BTreeSet<(u64, usize)>,
    /// Why each worker can no longer deliver, once it cannot.
    failed: Vec<Option<String>>,
    /// The batch handed out last (asked for again by a gradient check).
    last: Option<Prepared>,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

impl Shared {
    fn fail(&self, worker: usize, why: String) {
        let mut st = lock(&self.state);
        if st.failed[worker].is_none() {
            st.failed[worker] = Some(why);
        }
        drop(st);
        self.wake.notify_all();
    }
}

struct Worker {
    /// The trainer's end of the connection (requests go out here; its reader has a clone).
    stream: Mutex<UnixStream>,
    child: Mutex<Child>,
    pid: u32,
}

/// Preprocessing in producer processes, received over a Unix socket (see the module
/// documentation). Dropping it kills and reaps the producers.
pub struct ProducerFeed {
    config: FeedConfig,
    fields: Vec<Field>,
    options: FeedOptions,
    workers: Vec<Worker>,
    shared: Arc<Shared>,
    readers: Vec<JoinHandle<()>>,
    stats: Arc<FeedStats>,
    dir: PathBuf,
}

impl std::fmt::Debug for ProducerFeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProducerFeed")
            .field("config", &self.config)
            .field("pids", &self.pids())
            .finish()
    }
}

/// A feed error (a failure while training, exit code 1).
fn feed_error(message: String) -> EngineError {
    EngineError::Tensor {
        module: "data".into(),
        source: candle_core::Error::Msg(message),
    }
}

/// A fresh private directory for the socket (a Unix socket path must stay under 108 bytes).
fn socket_dir() -> io::Result<PathBuf> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = format!(
        "mosaic-feed-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let mut base = std::env::temp_dir();
    if base.as_os_str().len() + name.len() + 12 > 100 {
        base = PathBuf::from("/tmp");
    }
    let dir = base.join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
    Ok(dir)
}

/// Children killed and reaped when dropped (until handed over).
struct Reaper(Vec<Child>);

impl Drop for Reaper {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// How a process ended, in words.
fn ended(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("it exited with code {code}"),
        (None, Some(sig)) => format!("it was killed by signal {sig}"),
        _ => format!("it ended ({status})"),
    }
}

impl ProducerFeed {
    /// Starts `workers` producers by `launcher`, waits (up to `options.timeout`) until each has
    /// connected and made its raw data, and starts a reader thread per producer. A producer
    /// that exits, is refused its config or stays silent fails this with its reason; the ones
    /// started are killed.
    pub fn spawn(
        launcher: &Launcher,
        config: FeedConfig,
        fields: &[Field],
        workers: usize,
        options: FeedOptions,
    ) -> Result<ProducerFeed, EngineError> {
        config.check()?;
        if !(1..=MAX_PRODUCERS).contains(&workers) {
            return Err(EngineError::BadSetting {
                setting: "--producers".into(),
                message: format!("{workers} is not 1 to {MAX_PRODUCERS} processes"),
            });
        }
        if options.depth == 0 {
            return Err(EngineError::BadSetting {
                setting: "depth".into(),
                message: "expected at least 1 step ahead".into(),
            });
        }
        let io_err = |what: &str| {
            let what = what.to_string();
            move |e: io::Error| feed_error(format!("preprocessing producers: {what}: {e}"))
        };
        let dir = socket_dir().map_err(io_err("cannot create the socket's directory"))?;
        let result = Self::start(launcher, &config, workers, options, &dir);
        let (streams, children) = match result {
            Ok(x) => x,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                failed: vec![None; workers],
                ..State::default()
            }),
            wake: Condvar::new(),
        });
        let mut feed = ProducerFeed {
            config,
            fields: fields.to_vec(),
            options,
            workers: Vec::with_capacity(workers),
            shared,
            readers: Vec::with_capacity(workers),
            stats: Arc::default(),
            dir,
        };
        let mut children = children;
        for (w, (stream, child)) in streams.into_iter().zip(children.0.drain(..)).enumerate() {
            let pid = child.id();
            let reader = stream.try_clone();
            feed.workers.push(Worker {
                stream: Mutex::new(stream),
                child: Mutex::new(child),
                pid,
            });
            let reader = reader.map_err(io_err("cannot clone a connection"))?;
            let handle = feed.read(w, reader);
            feed.readers.push(handle);
        }
        Ok(feed)
    }

    /// Spawns the producers, accepts their connections, sends the config and waits until
    /// each is ready: the connections by worker index, and the children.
    fn start(
        launcher: &Launcher,
        config: &FeedConfig,
        workers: usize,
        options: FeedOptions,
        dir: &Path,
    ) -> Result<(Vec<UnixStream>, Reaper), EngineError> {
        let path = dir.join("feed.sock");
        let err = |what: String| move |e: io::Error| feed_error(format!("{what}: {e}"));
        let listener = UnixListener::bind(&path)
            .map_err(err(format!("cannot listen on {}", path.display())))?;
        listener
            .set_nonblocking(true)
            .map_err(err("cannot poll the socket".into()))?;
        let mut children = Reaper(Vec::with_capacity(workers));
        for w in 0..workers {
            let child = Command::new(&launcher.program)
                .args(&launcher.args)
                .arg("--socket")
                .arg(&path)
                .arg("--worker")
                .arg(w.to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .map_err(err(format!(
                    "cannot start preprocessing producer {w} ({})",
                    launcher.program.display()
                )))?;
            children.0.push(child);
        }
        let deadline = Instant::now() + options.timeout;
        let left = || {
            deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1))
        };
        let mut streams: Vec<Option<UnixStream>> = (0..workers).map(|_| None).collect();
        let mut connected = 0;
        while connected < workers {
            match listener.accept() {
                Ok((mut s, _)) => {
                    s.set_nonblocking(false)
                        .and_then(|()| s.set_read_timeout(Some(left())))
                        .map_err(err("cannot configure a connection".into()))?;
                    let hello = match read_frame(&mut s) {
                        Ok(Some((HELLO, p))) => p,
                        other => {
                            return Err(feed_error(format!(
                                "a preprocessing producer did not introduce itself: {other:?}"
                            )))
                        }
                    };
                    let w = Fields::new(&hello).u32().map_err(feed_error)? as usize;
                    if w >= workers || streams[w].is_some() {
                        return Err(feed_error(format!(
                            "a second or unknown preprocessing producer {w} connected"
                        )));
                    }
                    streams[w] = Some(s);
                    connected += 1;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    for (w, c) in children.0.iter_mut().enumerate() {
                        if let Ok(Some(status)) = c.try_wait() {
                            return Err(feed_error(format!(
                                "preprocessing producer {w} (pid {}) stopped before connecting: {}",
                                c.id(),
                                ended(status)
                            )));
                        }
                    }
                    if Instant::now() >= deadline {
                        return Err(feed_error(format!(
                            "preprocessing producers: {connected} of {workers} connected within \
                             {:?}",
                            options.timeout
                        )));
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(e) => return Err(err("cannot accept a producer".into())(e)),
            }
        }
        // Nobody else may connect now.
        let _ = std::fs::remove_file(&path);
        let mut streams: Vec<UnixStream> = streams.into_iter().flatten().collect();
        let json = serde_json::to_vec(config).map_err(|e| feed_error(e.to_string()))?;
        for (w, s) in streams.iter_mut().enumerate() {
            write_frame(s, CONFIG, &json)
                .map_err(err(format!("cannot configure preprocessing producer {w}")))?;
        }
        for (w, s) in streams.iter_mut().enumerate() {
            let pid = children.0[w].id();
            s.set_read_timeout(Some(left()))
                .map_err(err("cannot configure a connection".into()))?;
            let why = match read_frame(s) {
                Ok(Some((READY, _))) => None,
                Ok(Some((FAILED, m))) => Some(format!("failed: {}", String::from_utf8_lossy(&m))),
                Ok(Some((kind, _))) => Some(format!("sent frame {kind} instead of ready")),
                Ok(None) => Some("closed its connection while starting".into()),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    Some(format!("was not ready within {:?}", options.timeout))
                }
                Err(e) => Some(format!("connection failed while starting: {e}")),
            };
            if let Some(why) = why {
                return Err(feed_error(format!(
                    "preprocessing producer {w} (pid {pid}) {why}"
                )));
            }
            s.set_read_timeout(None)
                .map_err(err("cannot configure a connection".into()))?;
        }
        Ok((streams, children))
    }

    /// The reader thread of worker `w`: batches into the reorder buffer until the connection
    /// ends, then records why.
    fn read(&self, w: usize, mut stream: UnixStream) -> JoinHandle<()> {
        let shared = Arc::clone(&self.shared);
        let c = &self.config;
        let (h, wd, l) = (
            c.image.height as usize,
            c.image.width as usize,
            c.text.len as usize,
        );
        std::thread::spawn(move || loop {
            let why = match read_frame(&mut stream) {
                Ok(Some((BATCH, payload))) => match decode_batch(&payload, h, wd, l) {
                    Ok(p) => {
                        lock(&shared.state).ready.insert((p.step, p.batch), p);
                        shared.wake.notify_all();
                        continue;
                    }
                    Err(e) => format!("sent a bad batch: {e}"),
                },
                Ok(Some((FAILED, m))) => format!("failed: {}", String::from_utf8_lossy(&m)),
                Ok(Some((kind, _))) => format!("sent frame {kind} instead of a batch"),
                Ok(None) => "closed its connection".into(),
                Err(e) => format!("connection failed: {e}"),
            };
            shared.fail(w, why);
            return;
        })
    }

    /// The producers' process ids, by worker.
    pub fn pids(&self) -> Vec<u32> {
        self.workers.iter().map(|w| w.pid).collect()
    }

    /// The timings of its `batch` calls.
    pub fn stats(&self) -> Arc<FeedStats> {
        Arc::clone(&self.stats)
    }

    /// The prepared batch of `step`: asks the producers for steps `step .. step + depth` not
    /// yet asked for (worker `t mod K` makes step `t`), then waits for `step`. Fails, naming
    /// the producer, when the one making `step` has died or delivers nothing within the
    /// timeout.
    pub fn prepared(&self, step: u64, batch: usize) -> Result<Prepared, String> {
        let k = self.workers.len() as u64;
        let depth = self.options.depth as u64;
        let key = (step, batch);
        let mut st = lock(&self.shared.state);
        if let Some(p) = st.last.as_ref().filter(|p| (p.step, p.batch) == key) {
            return Ok(p.clone());
        }
        let window = |s: u64| s >= step && s < step.saturating_add(depth);
        st.ready.retain(|&(s, b), _| b == batch && window(s));
        st.asked.retain(|&(s, b)| b == batch && window(s));
        for t in step..step.saturating_add(depth) {
            let want = (t, batch);
            if st.asked.contains(&want) {
                continue;
            }
            let w = (t % k) as usize;
            let mut request = t.to_le_bytes().to_vec();
            request.extend_from_slice(&(batch as u32).to_le_bytes());
            let sent = write_frame(&mut *lock(&self.workers[w].stream), REQUEST, &request);
            match sent {
                Ok(()) => {
                    st.asked.insert(want);
                }
                Err(e) => {
                    if st.failed[w].is_none() {
                        st.failed[w] = Some(format!("cannot be asked for step {t}: {e}"));
                    }
                }
            }
        }
        let deadline = Instant::now() + self.options.timeout;
        let w = (step % k) as usize;
        loop {
            if let Some(p) = st.ready.remove(&key) {
                st.asked.remove(&key);
                st.last = Some(p.clone());
                return Ok(p);
            }
            if let Some(why) = st.failed[w].clone() {
                drop(st);
                return Err(self.failure(w, step, &why));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(format!(
                    "preprocessing producer {w} (pid {}) delivered nothing for step {step} \
                     within {:?}",
                    self.workers[w].pid, self.options.timeout
                ));
            }
            st = self
                .shared
                .wake
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Why worker `w` could not deliver `step`, with how its process ended if it has.
    fn failure(&self, w: usize, step: u64, why: &str) -> String {
        let worker = &self.workers[w];
        let mut status = None;
        let until = Instant::now() + Duration::from_secs(2);
        while status.is_none() && Instant::now() < until {
            status = lock(&worker.child).try_wait().ok().flatten();
            if status.is_none() {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        format!(
            "preprocessing producer {w} (pid {}) {why} before delivering step {step}; {}",
            worker.pid,
            status.map_or("it is still running".into(), ended)
        )
    }
}

impl DataSource for ProducerFeed {
    fn batch(&self, step: u64, batch: usize, device: &Device) -> candle_core::Result<Batch> {
        let t0 = Instant::now();
        let p = self
            .prepared(step, batch)
            .map_err(candle_core::Error::Msg)?;
        let b = p.to_batch(&self.config, &self.fields, device)?;
        self.stats.record(DataTiming {
            step,
            trainer_ms: t0.elapsed().as_secs_f64() * 1e3,
            producer_ms: p.prep_ms,
            images: p.images(&self.config),
        });
        Ok(b)
    }

    fn fields(&self) -> Vec<Field> {
        self.fields.clone()
    }
}

impl Drop for ProducerFeed {
    /// Closes the connections (producers exit on their own), kills and reaps the producers,
    /// joins the readers and removes the socket's directory.
    fn drop(&mut self) {
        for w in &self.workers {
            let _ = lock(&w.stream).shutdown(std::net::Shutdown::Both);
        }
        for w in &self.workers {
            let mut c = lock(&w.child);
            let _ = c.kill();
            let _ = c.wait();
        }
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
