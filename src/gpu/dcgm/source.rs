//! The DCGM-backed [`GpuSource`]: NVML (the wrapped source) reads everything it can; a DCGM
//! hostengine serves the profiling (`DCGM_FI_PROF_*`) fields NVML cannot read, i.e. on GPUs
//! without NVML GPM (before Hopper: A100, L40S, A10, T4, V100). The hostengine is either remote
//! (`-r host:port`, e.g. the GPU Operator's standalone `nvidia-dcgm`) or embedded: started in
//! this process by DCGM's library (`dcgmStartEmbedded_v2`), as dcgm-exporter does without `-r`
//! (see [`DcgmMode`]).
//!
//! **Which source wins on Hopper and newer**: NVML. Where NVML reads a field through GPM, the
//! wrapped source's reading is kept and DCGM is not asked for it; DCGM is asked only for the
//! fields the wrapped source reports as a [`FieldGap::ProfilingNeedsDcgm`] on that GPU. One
//! source per (GPU, field) keeps the values of a GPU from mixing two sampling windows.
//!
//! A background thread owns the DCGM connection: it maps DCGM's entities to our devices (by
//! UUID, and by (GPU UUID, GPU instance id) for MIG), plans a single-pass watch from the
//! profiling metric groups the GPU offers, watches at the collect interval and copies the latest
//! values into a shared map. The sampling tick only reads that map, so a slow or absent
//! hostengine never delays it. A hostengine that is down, restarts or refuses a field removes
//! only the series concerned; the `gpu_exporter_dcgm_*` self-metrics say why, and the thread
//! reconnects (with backoff) and watches again by itself.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use prometheus_client::registry::Registry;

pub use super::metrics::DcgmMetrics;
use super::plan::{self, Refusal, Target};
use super::{reading, Connection, DcgmError, DcgmLibrary, Entity, EntityGroup};
use crate::catalog::Field;
use crate::gpu::{
    Device, DeviceSample, FieldError, FieldGap, GpuProcess, GpuSource, Reading, SourceError,
    XidEvent,
};

/// Where the hostengine runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DcgmMode {
    /// Started inside the exporter by DCGM's library (no `-r`): dcgm-exporter's default, and
    /// the GPU Operator's unless it deploys its standalone `nvidia-dcgm`.
    Embedded,
    /// A hostengine of its own (`-r`): `host:port`, or a unix socket path (starting with `/`).
    Remote(String),
}

impl DcgmMode {
    /// The `mode` label value of `gpu_exporter_dcgm_mode`.
    pub fn as_str(&self) -> &'static str {
        match self {
            DcgmMode::Embedded => "embedded",
            DcgmMode::Remote(_) => "remote",
        }
    }
}

impl std::fmt::Display for DcgmMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DcgmMode::Embedded => f.write_str("the embedded hostengine"),
            DcgmMode::Remote(a) => write!(f, "the hostengine at {a} (-r)"),
        }
    }
}

/// How the DCGM source reaches the hostengine.
#[derive(Debug, Clone)]
pub struct DcgmOptions {
    /// The client library to load (`libdcgm.so.4`: the loader's search path).
    pub library: String,
    /// Embedded, or remote at an address.
    pub mode: DcgmMode,
    /// The embedded hostengine logs to stdout at this `DcgmLoggingSeverity_t`
    /// (`--enable-dcgm-log`, `--dcgm-log-level`); `None`: no log file.
    pub embedded_log: Option<i32>,
    /// The collect interval: DCGM samples the watched fields this often.
    pub interval: Duration,
    /// How long `dcgmConnect_v2` may wait.
    pub connect_timeout: Duration,
    /// The first wait before reconnecting; doubled after each failure up to `max_backoff`.
    pub min_backoff: Duration,
    /// The longest wait before reconnecting.
    pub max_backoff: Duration,
}

impl DcgmOptions {
    /// Options for the remote hostengine at `address` at `interval`, with the defaults (library
    /// `libdcgm.so.4`, 2 s connect timeout, reconnect backoff 0.5 s doubling to 10 s).
    pub fn new(address: &str, interval: Duration) -> Self {
        Self::with_mode(DcgmMode::Remote(address.to_owned()), interval)
    }

    /// Options for the embedded hostengine at `interval`, with the same defaults (a failed start
    /// is retried with the reconnect backoff).
    pub fn embedded(interval: Duration) -> Self {
        Self::with_mode(DcgmMode::Embedded, interval)
    }

    fn with_mode(mode: DcgmMode, interval: Duration) -> Self {
        Self {
            library: "libdcgm.so.4".to_owned(),
            mode,
            embedded_log: None,
            interval,
            connect_timeout: Duration::from_secs(2),
            min_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(10),
        }
    }
}

/// The latest values of one physical GPU and its GPU instances.
#[derive(Debug, Default)]
struct GpuValues {
    gpu: HashMap<Field, Reading>,
    instances: HashMap<u32, HashMap<Field, Reading>>,
}

/// What the tick and the reader thread share.
#[derive(Debug, Default)]
struct State {
    /// The devices of the last discovery.
    devices: Vec<Device>,
    /// The profiling fields the last tick asked DCGM for.
    wanted: BTreeSet<Field>,
    /// Bumped when `devices` or `wanted` change: the reader watches again.
    generation: u64,
    /// The latest values, by GPU UUID; replaced by each read, emptied when the hostengine is
    /// lost.
    latest: HashMap<String, GpuValues>,
    stop: bool,
    /// Set by the reader thread as it ends (even by a panic).
    exited: bool,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    metrics: Arc<DcgmMetrics>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits up to `d`, or until woken (a change, or stop); returns whether to stop.
    fn wait(&self, d: Duration, generation: Option<u64>) -> bool {
        let state = self.lock();
        let (state, _) = self
            .wake
            .wait_timeout_while(state, d, |s| {
                !s.stop && generation.is_none_or(|g| g == s.generation)
            })
            .unwrap_or_else(PoisonError::into_inner);
        state.stop
    }
}

/// NVML (or any source) plus DCGM for the profiling fields it cannot read.
#[derive(Debug)]
pub struct DcgmSource<S> {
    inner: S,
    shared: Arc<Shared>,
    reader: Option<JoinHandle<()>>,
}

impl<S: GpuSource> DcgmSource<S> {
    /// Loads DCGM's client library (`opts.library`) and [`DcgmSource::start`]s.
    ///
    /// # Errors
    /// [`DcgmError::Load`] / [`DcgmError::Symbol`], or [`DcgmError::Thread`].
    pub fn new(inner: S, opts: DcgmOptions) -> Result<Self, DcgmError> {
        let lib = DcgmLibrary::load(&opts.library)?;
        Self::start(inner, lib, opts)
    }

    /// Starts the reader thread on a loaded library; it initialises the library (`dcgmInit`)
    /// and connects in the background, so a slow DCGM never delays the exporter's start.
    ///
    /// # Errors
    /// [`DcgmError::Thread`].
    pub fn start(inner: S, lib: Arc<DcgmLibrary>, opts: DcgmOptions) -> Result<Self, DcgmError> {
        let shared = Arc::new(Shared::default());
        shared.metrics.set_mode(opts.mode.as_str());
        let s = Arc::clone(&shared);
        let reader = std::thread::Builder::new()
            .name("dcgm-reader".into())
            .spawn(move || {
                let _exited = Exited(Arc::clone(&s));
                Reader::new(lib, opts, s).run();
            })
            .map_err(DcgmError::Thread)?;
        Ok(Self {
            inner,
            shared,
            reader: Some(reader),
        })
    }

    /// The self-metrics.
    pub fn metrics(&self) -> &DcgmMetrics {
        &self.shared.metrics
    }

    /// The wrapped source.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// The fields of `fields` DCGM serves on `device`: profiling fields the wrapped source
    /// cannot read there.
    fn dcgm_fields(&self, device: &Device, fields: &[Field]) -> Vec<Field> {
        fields
            .iter()
            .copied()
            .filter(|f| {
                f.is_profiling()
                    && self.inner.field_gap(device, *f) == Some(FieldGap::ProfilingNeedsDcgm)
            })
            .collect()
    }
}

/// How long dropping the source waits for the reader thread to end. A DCGM call may block far
/// longer (a hostengine that does not answer, a library that ignores its connect timeout): past
/// this the thread is left to end with the process, so that SIGTERM is never held by DCGM.
const STOP_WAIT: Duration = Duration::from_millis(500);

/// Marks the reader thread as ended when dropped (on return or unwinding).
struct Exited(Arc<Shared>);

impl Drop for Exited {
    fn drop(&mut self) {
        self.0.lock().exited = true;
        self.0.wake.notify_all();
    }
}

impl<S> Drop for DcgmSource<S> {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        state.stop = true;
        self.shared.wake.notify_all();
        let (state, _) = self
            .shared
            .wake
            .wait_timeout_while(state, STOP_WAIT, |s| !s.exited)
            .unwrap_or_else(PoisonError::into_inner);
        let exited = state.exited;
        drop(state);
        match self.reader.take() {
            Some(r) if exited => {
                let _ = r.join();
            }
            Some(_) => tracing::warn!(
                waited = ?STOP_WAIT,
                "the DCGM reader is still inside a DCGM call; not waiting for it"
            ),
            None => {}
        }
    }
}

impl<S: GpuSource> GpuSource for DcgmSource<S> {
    /// The inner source's name ("nvml"), not "dcgm", on purpose: the name is the `--backend`
    /// that was chosen (DCGM only adds the profiling fields NVML cannot read), and it is
    /// user-visible as the `backend` label of `gpu_exporter_build_info` and in the startup
    /// warnings about fields the backend cannot read. Saying "dcgm" would change that series
    /// for every node where DCGM happens to load.
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn supports(&self, field: Field) -> bool {
        self.inner.supports(field) || field.is_profiling()
    }

    fn field_gap(&self, device: &Device, field: Field) -> Option<FieldGap> {
        match self.inner.field_gap(device, field) {
            Some(FieldGap::ProfilingNeedsDcgm) if field.is_profiling() => None,
            other => other,
        }
    }

    fn devices(&self) -> Result<Vec<Device>, SourceError> {
        let devices = self.inner.devices()?;
        let mut state = self.shared.lock();
        if state.devices != devices {
            state.devices.clone_from(&devices);
            state.generation += 1;
            drop(state);
            self.shared.wake.notify_all();
        }
        Ok(devices)
    }

    fn sample(&self, device: &Device, fields: &[Field]) -> Result<DeviceSample, SourceError> {
        let mut sample = self.inner.sample(device, fields)?;
        let dcgm = self.dcgm_fields(device, fields);
        if dcgm.is_empty() {
            // A catalog without any profiling field (a CSV reload dropped them all): nothing is
            // wanted any more, and the reader unwatches. (A GPU whose own source reads them,
            // e.g. through GPM, leaves the set as the other GPUs want it.)
            if !fields.iter().any(|f| f.is_profiling()) {
                let mut state = self.shared.lock();
                if !state.wanted.is_empty() {
                    state.wanted.clear();
                    state.generation += 1;
                    self.shared.wake.notify_all();
                }
            }
            return Ok(sample);
        }
        let mut state = self.shared.lock();
        // The fields of this tick (a CSV reload may add or drop some): the GPUs without GPM all
        // lack the same ones, so the set is stable from one device to the next.
        if state.wanted.len() != dcgm.len() || !dcgm.iter().all(|f| state.wanted.contains(f)) {
            state.wanted = dcgm.iter().copied().collect();
            state.generation += 1;
            self.shared.wake.notify_all();
        }
        // Absent from the map (not connected, refused, not read yet): no series, and no field
        // error counted: gpu_exporter_dcgm_* says why.
        let values = state.latest.get(device.identity.uuid.as_str());
        let get = |m: Option<&HashMap<Field, Reading>>, f: &Field| {
            m.and_then(|m| m.get(f))
                .cloned()
                .unwrap_or(Err(FieldError::NotSupported))
        };
        for (f, r) in &mut sample.readings {
            if dcgm.contains(f) {
                *r = get(values.map(|v| &v.gpu), f);
            }
        }
        for inst in &mut sample.instances {
            let m = values.and_then(|v| v.instances.get(&inst.gi_id));
            for (f, r) in &mut inst.readings {
                if dcgm.contains(f) {
                    *r = get(m, f);
                }
            }
        }
        Ok(sample)
    }

    fn wants_rediscovery(&self) -> bool {
        self.inner.wants_rediscovery()
    }

    fn drain_xids(&self) -> Vec<(String, XidEvent)> {
        self.inner.drain_xids()
    }

    fn processes(&self, device: &Device) -> Result<Vec<GpuProcess>, FieldError> {
        self.inner.processes(device)
    }

    fn register_metrics(&self, registry: &mut Registry) {
        self.inner.register_metrics(registry);
        self.shared.metrics.register(registry);
    }
}

/// What is watched on one connection: every object made on the hostengine for it, so that all
/// of them are destroyed again, whatever failed half-way.
struct Watching {
    generation: u64,
    /// Entity groups of at most [`plan::MAX_GROUP_ENTITIES`] entities each.
    groups: Vec<super::GroupId>,
    field_groups: Vec<super::FieldGroupId>,
    entities: BTreeMap<Entity, Target>,
    fields: Vec<u16>,
}

impl Watching {
    fn new(generation: u64) -> Self {
        Self {
            generation,
            groups: Vec::new(),
            field_groups: Vec::new(),
            entities: BTreeMap::new(),
            fields: Vec::new(),
        }
    }
}

/// Why a session on a connection ended.
enum End {
    Stop,
    Lost,
}

/// The `gpu_exporter_dcgm_errors_total` reason of a failed watch: listing what the hostengine
/// has (`entities`), or setting up the watch on it (`watch`).
fn watch_failure_reason(e: &DcgmError) -> &'static str {
    match e {
        DcgmError::Call {
            call:
                "dcgmGetAllDevices"
                | "dcgmGetDeviceAttributes"
                | "dcgmGetGpuInstanceHierarchy"
                | "dcgmProfGetSupportedMetricGroups",
            ..
        } => "entities",
        _ => "watch",
    }
}

/// Watches field group `fg` on every group of `groups`; when one refuses, unwatches those done
/// and returns the refusal.
fn watch_on_all(
    conn: &Connection,
    groups: &[super::GroupId],
    fg: super::FieldGroupId,
    update_us: i64,
) -> Result<(), DcgmError> {
    for (i, &g) in groups.iter().enumerate() {
        if let Err(e) = conn.watch(g, fg, update_us, 2) {
            for &done in &groups[..i] {
                let _ = conn.unwatch(done, fg);
            }
            return Err(e);
        }
    }
    Ok(())
}

/// The reader thread.
struct Reader {
    lib: Arc<DcgmLibrary>,
    opts: DcgmOptions,
    shared: Arc<Shared>,
    serial: u64,
}

impl Reader {
    fn new(lib: Arc<DcgmLibrary>, opts: DcgmOptions, shared: Arc<Shared>) -> Self {
        Self {
            lib,
            opts,
            shared,
            serial: 0,
        }
    }

    fn metrics(&self) -> &DcgmMetrics {
        &self.shared.metrics
    }

    fn run(mut self) {
        let mut backoff = self.opts.min_backoff;
        let mut connected_before = false;
        loop {
            if self.shared.lock().stop {
                return;
            }
            // dcgmInit here, not before the exporter serves: it may take its time.
            if let Err(e) = self.lib.init() {
                self.metrics().count_error("init");
                tracing::warn!(error = %e, retry_in = ?backoff, "cannot initialise DCGM's client library (for {}); retrying", self.opts.mode);
                if self.shared.wait(backoff, None) {
                    return;
                }
                backoff = (backoff * 2).min(self.opts.max_backoff);
                continue;
            }
            let address = match &self.opts.mode {
                DcgmMode::Remote(a) => a.clone(),
                DcgmMode::Embedded => String::new(),
            };
            let connected = match &self.opts.mode {
                DcgmMode::Remote(a) => {
                    let unix = a.starts_with('/');
                    let timeout =
                        u32::try_from(self.opts.connect_timeout.as_millis()).unwrap_or(u32::MAX);
                    self.lib.connect(a, unix, timeout)
                }
                DcgmMode::Embedded => self.lib.start_embedded(self.opts.embedded_log),
            };
            match connected {
                Ok(conn) => {
                    if connected_before {
                        self.metrics().count_reconnect();
                    }
                    connected_before = true;
                    tracing::info!("connected to {} of DCGM", self.opts.mode);
                    self.metrics().set_connected(true);
                    backoff = self.opts.min_backoff;
                    let end = self.session(&conn);
                    self.metrics().set_connected(false);
                    self.metrics().set_watched(0);
                    self.shared.lock().latest.clear();
                    if matches!(end, End::Stop) {
                        return;
                    }
                    tracing::warn!("lost {} of DCGM; its DCGM_FI_PROF_* series are absent until it is back (gpu_exporter_dcgm_connected)", self.opts.mode);
                }
                Err(e) if self.opts.mode == DcgmMode::Embedded => {
                    // Never fatal: NVML keeps serving, the self-metrics say why, and a later try
                    // may succeed (a driver that was not ready yet).
                    self.metrics().count_error("start_embedded");
                    if matches!(e, DcgmError::Symbol { .. }) {
                        tracing::error!(error = %e, "cannot start DCGM's embedded hostengine: the library lacks it; the DCGM_FI_PROF_* series of GPUs before Hopper stay absent (NVML serves the rest)");
                        return;
                    }
                    tracing::warn!(error = %e, retry_in = ?backoff, "cannot start DCGM's embedded hostengine; the DCGM_FI_PROF_* series of GPUs before Hopper are absent (NVML serves the rest); retrying");
                }
                Err(DcgmError::Call { code, .. }) if code == super::status::BADPARAM => {
                    // The address itself is refused: no retry can help.
                    self.metrics().count_error("connect");
                    tracing::error!(%address, "DCGM refuses the hostengine address of -r / --remote-hostengine-info / DCGM_REMOTE_HOSTENGINE_INFO (DCGM_ST_BADPARAM): not connecting; fix the address and restart");
                    return;
                }
                Err(e) => {
                    self.metrics().count_error("connect");
                    tracing::warn!(%address, error = %e, retry_in = ?backoff, "cannot connect to the DCGM hostengine (-r); retrying");
                }
            }
            if self.shared.wait(backoff, None) {
                return;
            }
            backoff = (backoff * 2).min(self.opts.max_backoff);
        }
    }

    /// Watches and reads on `conn` until it is lost or the source stops.
    fn session(&mut self, conn: &Connection) -> End {
        let mut watching: Option<Watching> = None;
        let end = loop {
            let (generation, devices, wanted) = {
                let s = self.shared.lock();
                if s.stop {
                    break End::Stop;
                }
                (s.generation, s.devices.clone(), s.wanted.clone())
            };
            if watching.as_ref().map(|w| w.generation) != Some(generation) {
                if let Some(w) = watching.take() {
                    Self::unwatch(conn, &w);
                    self.metrics().set_watched(0);
                }
                match self.watch(conn, generation, &devices, &wanted) {
                    Ok(w) => {
                        self.metrics().set_watched(w.fields.len());
                        watching = Some(w);
                    }
                    Err(e) if e.connection_lost() => {
                        self.metrics().count_error("connection_lost");
                        break End::Lost;
                    }
                    Err(e) => {
                        let reason = watch_failure_reason(&e);
                        self.metrics().count_error(reason);
                        self.shared.lock().latest.clear();
                        tracing::warn!(error = %e, "DCGM: cannot {}; the DCGM_FI_PROF_* series are absent; retrying at the next interval", if reason == "entities" { "list the hostengine's entities" } else { "watch the profiling fields" });
                    }
                }
            }
            if let Some(w) = &watching {
                if let Err(e) = self.read(conn, w) {
                    if e.connection_lost() {
                        self.metrics().count_error("connection_lost");
                        break End::Lost;
                    }
                    self.metrics().count_error("read");
                    tracing::warn!(error = %e, "DCGM: reading the latest values failed");
                    self.shared.lock().latest.clear();
                }
            }
            if self.shared.wait(self.opts.interval, Some(generation)) {
                break End::Stop;
            }
        };
        if let (End::Stop, Some(w)) = (&end, &watching) {
            Self::unwatch(conn, w);
        }
        end
    }

    /// Stops every watch of `w` and destroys its field and entity groups.
    fn unwatch(conn: &Connection, w: &Watching) {
        for &g in &w.groups {
            for &fg in &w.field_groups {
                let _ = conn.unwatch(g, fg);
            }
        }
        for &fg in &w.field_groups {
            let _ = conn.destroy_field_group(fg);
        }
        for &g in &w.groups {
            let _ = conn.destroy_group(g);
        }
    }

    fn name(&mut self, what: &str) -> String {
        self.serial += 1;
        format!("gpu-exporter-{}-{what}-{}", std::process::id(), self.serial)
    }

    /// Maps the entities, plans and starts the watch. Refusals are recorded, not returned.
    /// On an error, whatever was made on the hostengine for it is destroyed again (a group left
    /// behind at each retry would fill the hostengine's group table for good).
    fn watch(
        &mut self,
        conn: &Connection,
        generation: u64,
        devices: &[Device],
        wanted: &BTreeSet<Field>,
    ) -> Result<Watching, DcgmError> {
        let mut w = Watching::new(generation);
        match self.watch_into(conn, &mut w, devices, wanted) {
            Ok(()) => Ok(w),
            Err(e) => {
                if !e.connection_lost() {
                    Self::unwatch(conn, &w);
                }
                Err(e)
            }
        }
    }

    fn watch_into(
        &mut self,
        conn: &Connection,
        w: &mut Watching,
        devices: &[Device],
        wanted: &BTreeSet<Field>,
    ) -> Result<(), DcgmError> {
        if wanted.is_empty() || devices.is_empty() {
            self.metrics().set_refused(BTreeMap::new());
            return Ok(());
        }
        let mut gpus = Vec::new();
        for id in conn.gpu_ids()? {
            gpus.push((id, conn.gpu_uuid(id)?));
        }
        let mig = if devices.iter().any(|d| !d.instances.is_empty()) {
            conn.mig_hierarchy()?
        } else {
            Vec::new()
        };
        w.entities = plan::map_entities(devices, &gpus, &mig);
        for d in devices {
            let known = w.entities.values().any(|t| t.uuid == d.identity.uuid);
            if !known {
                tracing::warn!(gpu = d.identity.index, uuid = %d.identity.uuid, "the DCGM hostengine does not list this GPU; its DCGM_FI_PROF_* series are absent");
            }
        }
        let wanted_ids: BTreeSet<u16> = wanted.iter().map(|f| f.id()).collect();
        let mut refused: BTreeMap<u16, Refusal> = BTreeMap::new();
        // The metric groups of the first mapped GPU whose profiling module answers (the GPUs
        // of a node are one model).
        let mut groups = None;
        for e in w.entities.keys().filter(|e| e.group == EntityGroup::Gpu) {
            match conn.metric_groups(e.id) {
                Ok(g) => {
                    groups = Some(g);
                    break;
                }
                Err(e) if e.connection_lost() => return Err(e),
                Err(DcgmError::Call { code, .. }) => {
                    for f in &wanted_ids {
                        refused.insert(*f, Refusal::from_status(code));
                    }
                }
                Err(e) => return Err(e),
            }
        }
        let planned = match &groups {
            Some(g) => {
                refused.clear();
                plan::plan_watch(&wanted_ids, g)
            }
            None => plan::WatchPlan::default(),
        };
        refused.extend(planned.refused);
        if !planned.watch.is_empty() && !w.entities.is_empty() {
            // DCGM holds at most 64 entities in a group: one group per 64.
            let entities: Vec<Entity> = w.entities.keys().copied().collect();
            for chunk in plan::entity_groups(&entities) {
                let name = self.name("entities");
                w.groups.push(conn.create_group(&name, chunk)?);
            }
            let update_us = i64::try_from(self.opts.interval.as_micros()).unwrap_or(i64::MAX);
            // All together first; when the hostengine refuses the set, field by field, so a
            // refused field costs only its own series.
            let name = self.name("fields");
            let fg = conn.create_field_group(&name, &planned.watch)?;
            w.field_groups.push(fg);
            match watch_on_all(conn, &w.groups, fg, update_us) {
                Ok(()) => w.fields.clone_from(&planned.watch),
                Err(e) if e.connection_lost() => return Err(e),
                Err(e) => {
                    self.metrics().count_error("watch");
                    tracing::warn!(error = %e, "DCGM refused to watch the profiling fields together; watching them one by one");
                    w.field_groups.pop();
                    let _ = conn.destroy_field_group(fg);
                    for &f in &planned.watch {
                        let name = self.name("field");
                        let fg = conn.create_field_group(&name, &[f])?;
                        match watch_on_all(conn, &w.groups, fg, update_us) {
                            Ok(()) => {
                                w.field_groups.push(fg);
                                w.fields.push(f);
                            }
                            Err(e) if e.connection_lost() => return Err(e),
                            Err(e) => {
                                let _ = conn.destroy_field_group(fg);
                                let code = match e {
                                    DcgmError::Call { code, .. } => code,
                                    _ => super::status::GENERIC_ERROR,
                                };
                                refused.insert(f, Refusal::from_status(code));
                            }
                        }
                    }
                }
            }
        }
        let refused: BTreeMap<Field, Refusal> = refused
            .into_iter()
            .filter_map(|(id, r)| Some((Field::from_id(id)?, r)))
            .collect();
        if !refused.is_empty() {
            let list: Vec<String> = refused
                .iter()
                .map(|(f, r)| format!("{} ({})", f.dcgm_name(), r.as_str()))
                .collect();
            tracing::warn!(
                fields = %list.join(","),
                "DCGM does not serve these fields; their series are absent (gpu_exporter_dcgm_fields_refused)"
            );
        }
        self.metrics().set_refused(refused);
        Ok(())
    }

    /// One `dcgmEntitiesGetLatestValues` of everything watched, into the shared map.
    fn read(&self, conn: &Connection, w: &Watching) -> Result<(), DcgmError> {
        if w.fields.is_empty() || w.entities.is_empty() {
            self.shared.lock().latest.clear();
            return Ok(());
        }
        let entities: Vec<Entity> = w.entities.keys().copied().collect();
        let values = conn.latest(&entities, &w.fields)?;
        let mut latest: HashMap<String, GpuValues> = HashMap::new();
        for v in &values {
            let (Some(target), Some(field)) =
                (w.entities.get(&v.entity), Field::from_id(v.field_id))
            else {
                continue;
            };
            let gpu = latest.entry(target.uuid.clone()).or_default();
            let map = match target.gi {
                None => &mut gpu.gpu,
                Some(gi) => gpu.instances.entry(gi).or_default(),
            };
            map.insert(field, reading(v));
        }
        self.shared.lock().latest = latest;
        self.metrics().count_read();
        Ok(())
    }
}
