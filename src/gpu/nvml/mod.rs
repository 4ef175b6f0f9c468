//! The NVML backend: real NVIDIA GPUs through `libnvidia-ml.so.1`.
//!
//! Layers, top to bottom:
//! - [`NvmlSource`] implements [`GpuSource`]: discovery (identity and static facts read once
//!   per GPU, MIG instances re-enumerated every discovery), one batched field-values call per
//!   device per tick plus the few calls that have no field id, GPM deltas across ticks, GPU loss,
//!   the XID event thread, and NVML initialisation retried with backoff when the driver is not
//!   there yet.
//! - [`convert`]: pure mapping from DCGM fields to NVML calls and units.
//! - [`api::NvmlApi`]: the narrow seam, one method per NVML call; [`real::RealNvml`] is the
//!   only code that touches `nvml-wrapper` (with [`ffi`] for the few calls it lacks),
//!   [`fake::FakeNvml`] an in-memory GPU fleet for tests, [`counting::Counting`] counts calls.

pub mod api;
pub mod convert;
pub mod counting;
pub mod fake;
mod ffi;
pub mod real;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::catalog::field::MigScope;
use crate::catalog::Field;
use crate::gpu::{
    Device, DeviceSample, FieldError, GpuIdentity, GpuSource, InstanceSample, MigInstance,
    MigPlacement, Reading, SourceError, Value, XidEvent,
};

use api::{ApiError, EventWait, FieldRequest, GpmMetric, MemoryInfo, NvmlApi};
use convert::{NvlinkCounter, Plan, StaticFact};

/// Why NVML could not be initialised. The text says what is missing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InitError {
    /// The library could not be loaded.
    #[error("cannot load libnvidia-ml.so.1 ({detail}): the NVIDIA driver is not installed on this node, or its libraries are not mounted into the container (run with the NVIDIA container runtime)")]
    LibraryNotFound {
        /// The loader's message.
        detail: String,
    },
    /// The library loaded but the kernel driver is not running.
    #[error("libnvidia-ml.so.1 loaded but the NVIDIA kernel driver is not loaded (NVML_ERROR_DRIVER_NOT_LOADED); waiting for the driver")]
    DriverNotLoaded,
    /// No permission to talk to the driver.
    #[error("NVML initialisation was refused (NVML_ERROR_NO_PERMISSION): the process cannot open /dev/nvidiactl and /dev/nvidia*")]
    NoPermission,
    /// Anything else.
    #[error("NVML initialisation failed: {0}")]
    Failed(String),
}

/// Errors of this module, as the `cause` of a [`SourceError`].
#[derive(Debug, thiserror::Error)]
pub enum NvmlError {
    /// NVML is not initialised (yet); initialisation is retried with backoff.
    #[error("NVML is not initialised")]
    NotInitialised(#[source] InitError),
    /// An NVML call failed.
    #[error("{call}")]
    Call {
        /// The C function.
        call: &'static str,
        /// What it returned.
        #[source]
        cause: ApiError,
    },
    /// The device was not found by the last discovery.
    #[error("GPU {0} is not among the discovered devices")]
    Unknown(String),
}

/// How NVML initialisation is retried while it fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Delay after the first failure.
    pub initial: Duration,
    /// The longest delay.
    pub max: Duration,
}

impl Default for RetryPolicy {
    /// 1 s, doubling to 60 s.
    fn default() -> Self {
        Self {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(60),
        }
    }
}

/// How long the event thread waits per `nvmlEventSetWait` call (bounds shutdown latency).
const EVENT_WAIT_MS: u32 = 500;

type InitFn<A> = dyn Fn() -> Result<A, InitError> + Send + Sync;

/// The NVML-backed [`GpuSource`], generic over the low-level API so it runs against
/// [`fake::FakeNvml`] in tests. Construct the real one with [`NvmlSource::real`].
pub struct NvmlSource<A: NvmlApi> {
    init: Box<InitFn<A>>,
    retry: RetryPolicy,
    state: Mutex<State<A>>,
    /// GPM support decided at startup: 0 unknown (NVML not up at startup), 1 yes, 2 no.
    gpm_decision: AtomicU8,
    xids: Arc<XidQueue>,
}

impl<A: NvmlApi> std::fmt::Debug for NvmlSource<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlSource")
            .field("init_error", &self.init_error())
            .finish_non_exhaustive()
    }
}

enum State<A: NvmlApi> {
    Pending {
        error: InitError,
        delay: Duration,
        next_attempt: Instant,
        attempts: u64,
    },
    Ready(Box<Ready<A>>),
}

struct Ready<A: NvmlApi> {
    api: Arc<A>,
    system: Vec<(StaticFact, Reading)>,
    gpus: HashMap<String, GpuState<A>>,
    events: Option<EventThread>,
}

struct GpuState<A: NvmlApi> {
    handle: A::Device,
    identity: GpuIdentity,
    statics: Vec<(StaticFact, Reading)>,
    gpm: bool,
    mig: Vec<(u32, A::Device)>,
    prev_gpm: Option<A::GpmSample>,
    prev_mig_gpm: HashMap<u32, A::GpmSample>,
    prev_nvlink: Option<NvlinkCounter>,
}

/// XIDs recorded by the event thread, waiting for [`GpuSource::drain_xids`].
#[derive(Debug, Default)]
struct XidQueue {
    items: Mutex<Vec<(String, XidEvent)>>,
    added: Condvar,
}

impl XidQueue {
    fn push(&self, uuid: String, xid: u64) {
        self.items
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((uuid, XidEvent { xid }));
        self.added.notify_all();
    }
}

struct EventThread {
    uuids: Vec<String>,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl Drop for EventThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The event thread's loop: wait, record XIDs, until stopped or NVML fails.
fn pump_events(mut events: impl EventWait, queue: &XidQueue, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        match events.wait(EVENT_WAIT_MS) {
            Ok(Some(r)) => {
                tracing::warn!(gpu = %r.uuid, xid = r.xid, "XID {}: {}", r.xid, crate::health::xid_message(r.xid));
                queue.push(r.uuid, r.xid);
            }
            Ok(None) | Err(ApiError::Timeout) => {}
            Err(e) => {
                tracing::warn!(error = %e, "NVML event wait failed; XID events are re-registered at the next device discovery");
                return;
            }
        }
    }
}

/// A device read aborted because the GPU fell off the bus.
struct Lost;

/// Passes a call result through, aborting the device read on `GpuLost`.
fn check<T>(r: Result<T, ApiError>) -> Result<Result<T, ApiError>, Lost> {
    match r {
        Err(ApiError::GpuLost) => Err(Lost),
        other => Ok(other),
    }
}

/// Calls `f` once and keeps its result for the other fields the same call serves.
fn once<T: Clone>(
    slot: &mut Option<Result<T, ApiError>>,
    f: impl FnOnce() -> Result<T, ApiError>,
) -> Result<Result<T, ApiError>, Lost> {
    if slot.is_none() {
        *slot = Some(check(f())?);
    }
    Ok(slot.clone().unwrap_or(Err(ApiError::NotSupported)))
}

fn int(r: Result<u32, ApiError>) -> Reading {
    r.map(|v| Value::Int(i64::from(v)))
        .map_err(|e| convert::field_error(&e))
}

fn text(r: Result<String, ApiError>) -> Reading {
    r.map(Value::Text).map_err(|e| convert::field_error(&e))
}

impl<A: NvmlApi> NvmlSource<A> {
    /// A source that initialises NVML with `init` now and, while that fails, again at most
    /// once per backoff delay (on [`GpuSource::devices`] calls).
    pub fn new(
        init: impl Fn() -> Result<A, InitError> + Send + Sync + 'static,
        retry: RetryPolicy,
    ) -> Self {
        let source = Self {
            init: Box::new(init),
            retry,
            state: Mutex::new(State::Pending {
                error: InitError::Failed("not attempted".into()),
                delay: Duration::ZERO,
                next_attempt: Instant::now(),
                attempts: 0,
            }),
            gpm_decision: AtomicU8::new(0),
            xids: Arc::new(XidQueue::default()),
        };
        // The first attempt (and discovery, which decides GPM support) happens now, so the
        // composition root knows whether NVML is up before it filters the catalog.
        if let Err(e) = source.devices() {
            tracing::debug!(error = %crate::error_chain(&e), "NVML not available at startup");
        }
        source
    }

    /// Why NVML is not initialised, or `None` once it is.
    pub fn init_error(&self) -> Option<InitError> {
        match &*self.lock() {
            State::Pending { error, .. } => Some(error.clone()),
            State::Ready(_) => None,
        }
    }

    /// Initialisation attempts made so far (0 once initialised counts the successful one).
    pub fn init_attempts(&self) -> u64 {
        match &*self.lock() {
            State::Pending { attempts, .. } => *attempts,
            State::Ready(_) => 0,
        }
    }

    /// Blocks until at least `n` XIDs are queued or `timeout` passes; returns whether they are.
    /// For tests and tools that need to know the event thread has delivered.
    pub fn wait_for_xids(&self, n: usize, timeout: Duration) -> bool {
        let items = self
            .xids
            .items
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let (items, _) = self
            .xids
            .added
            .wait_timeout_while(items, timeout, |v| v.len() < n)
            .unwrap_or_else(PoisonError::into_inner);
        items.len() >= n
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<A>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Tries to initialise if due. Returns the ready state or the init error.
    fn ensure_ready<'a>(&self, state: &'a mut State<A>) -> Result<&'a mut Ready<A>, InitError> {
        if let State::Pending {
            error,
            delay,
            next_attempt,
            attempts,
        } = state
        {
            let now = Instant::now();
            if now < *next_attempt {
                return Err(error.clone());
            }
            *attempts += 1;
            match (self.init)() {
                Ok(api) => {
                    let api = Arc::new(api);
                    let system = vec![
                        (StaticFact::DriverVersion, text(api.driver_version())),
                        (StaticFact::NvmlVersion, text(api.nvml_version())),
                        (
                            StaticFact::CudaDriverVersion,
                            api.cuda_driver_version()
                                .map(|v| Value::Int(i64::from(v)))
                                .map_err(|e| convert::field_error(&e)),
                        ),
                    ];
                    let driver = match &system[0].1 {
                        Ok(v) => v.to_string(),
                        Err(e) => e.as_str().to_owned(),
                    };
                    tracing::info!(%driver, attempts = *attempts, "NVML initialised");
                    *state = State::Ready(Box::new(Ready {
                        api,
                        system,
                        gpus: HashMap::new(),
                        events: None,
                    }));
                }
                Err(e) => {
                    let prev = (*attempts > 1).then_some(*delay);
                    *delay = convert::next_backoff(prev, self.retry.initial, self.retry.max);
                    *next_attempt = now + *delay;
                    if *error != e || *attempts == 1 {
                        tracing::warn!(retry_in_s = delay.as_secs_f64(), "{e}");
                    }
                    *error = e.clone();
                    return Err(e);
                }
            }
        }
        match state {
            State::Ready(r) => Ok(r),
            State::Pending { error, .. } => Err(error.clone()),
        }
    }

    fn discover(&self, ready: &mut Ready<A>) -> Result<Vec<Device>, SourceError> {
        let api = Arc::clone(&ready.api);
        let count = api.device_count().map_err(|cause| SourceError::Discovery {
            cause: Box::new(NvmlError::Call {
                call: "nvmlDeviceGetCount_v2",
                cause,
            }),
        })?;
        let mut found: HashMap<String, GpuState<A>> = HashMap::new();
        let mut devices = Vec::new();
        let mut old = std::mem::take(&mut ready.gpus);
        for index in 0..count {
            let handle_uuid = api
                .device_by_index(index)
                .and_then(|h| api.uuid(&h).map(|u| (h, u)));
            let (handle, uuid) = match handle_uuid {
                Ok(x) => x,
                Err(ApiError::GpuLost) => {
                    // Keep a GPU we knew at this index: its reads fail as lost, so its health
                    // series say FAIL instead of vanishing.
                    let known = old
                        .iter()
                        .find(|(_, g)| g.identity.index == index)
                        .map(|(u, _)| u.clone());
                    match known.and_then(|u| old.remove_entry(&u)) {
                        Some((uuid, g)) => {
                            tracing::warn!(gpu = index, %uuid, "GPU has fallen off the bus");
                            devices.push(Device {
                                identity: g.identity.clone(),
                                mig_enabled: !g.mig.is_empty(),
                                instances: Vec::new(),
                            });
                            found.insert(uuid, g);
                        }
                        None => {
                            tracing::warn!(gpu = index, "GPU has fallen off the bus before it was ever read; it is not exported");
                        }
                    }
                    continue;
                }
                Err(e) => {
                    tracing::warn!(gpu = index, error = %e, "cannot open GPU; skipping it");
                    continue;
                }
            };
            let mut g = match old.remove(&uuid) {
                Some(mut g) => {
                    g.handle = handle;
                    g.identity.index = index;
                    g
                }
                None => self.read_static(&api, handle, index, uuid.clone()),
            };
            let (mig_enabled, instances) = Self::read_mig(&api, &mut g);
            devices.push(Device {
                identity: g.identity.clone(),
                mig_enabled,
                instances,
            });
            found.insert(uuid, g);
        }
        for uuid in old.keys() {
            tracing::warn!(%uuid, "GPU is gone from NVML's device list");
        }
        ready.gpus = found;
        devices.sort_by_key(|d| d.identity.index);

        if self.gpm_decision.load(Ordering::Relaxed) == 0 {
            let any = ready.gpus.values().any(|g| g.gpm);
            self.gpm_decision
                .store(if any { 1 } else { 2 }, Ordering::Relaxed);
        }
        self.ensure_events(ready);
        Ok(devices)
    }

    fn read_static(&self, api: &A, handle: A::Device, index: u32, uuid: String) -> GpuState<A> {
        let name = api.name(&handle);
        let identity = GpuIdentity {
            index,
            uuid: uuid.clone(),
            pci_bus_id: api.pci_bus_id(&handle).unwrap_or_else(|e| {
                tracing::warn!(gpu = index, error = %e, "nvmlDeviceGetPciInfo failed");
                String::new()
            }),
            minor: api.minor_number(&handle).unwrap_or_else(|e| {
                tracing::warn!(gpu = index, error = %e, "nvmlDeviceGetMinorNumber failed; using the index");
                index
            }),
            model: name.clone().unwrap_or_default(),
        };
        let statics = vec![
            (StaticFact::Name, text(name)),
            (StaticFact::Brand, text(api.brand(&handle))),
            (StaticFact::Serial, text(api.serial(&handle))),
            (StaticFact::Vbios, text(api.vbios_version(&handle))),
            (
                StaticFact::InforomImage,
                text(api.inforom_image_version(&handle)),
            ),
            (
                StaticFact::Inforom(api::InforomObject::Oem),
                text(api.inforom_version(&handle, api::InforomObject::Oem)),
            ),
            (
                StaticFact::Inforom(api::InforomObject::Ecc),
                text(api.inforom_version(&handle, api::InforomObject::Ecc)),
            ),
            (
                StaticFact::Inforom(api::InforomObject::Power),
                text(api.inforom_version(&handle, api::InforomObject::Power)),
            ),
        ];
        let gpm = api.gpm_supported(&handle).unwrap_or(false);
        tracing::info!(gpu = index, %uuid, model = %identity.model, gpm, "GPU found");
        GpuState {
            handle,
            identity,
            statics,
            gpm,
            mig: Vec::new(),
            prev_gpm: None,
            prev_mig_gpm: HashMap::new(),
            prev_nvlink: None,
        }
    }

    /// Re-enumerates MIG devices (handles can change on reconfiguration), skipping empty slots.
    fn read_mig(api: &A, g: &mut GpuState<A>) -> (bool, Vec<MigInstance>) {
        let index = g.identity.index;
        let enabled = api.mig_enabled(&g.handle).unwrap_or(false);
        let mut handles = Vec::new();
        let mut instances = Vec::new();
        if enabled {
            let slots = api.mig_device_slots(&g.handle).unwrap_or(0);
            for slot in 0..slots {
                let mig = match api.mig_device_by_index(&g.handle, slot) {
                    Ok(m) => m,
                    Err(ApiError::NotFound) => continue,
                    Err(e) => {
                        tracing::warn!(gpu = index, slot, error = %e, "cannot open MIG device");
                        continue;
                    }
                };
                let (gi_id, uuid) = match (api.gpu_instance_id(&mig), api.uuid(&mig)) {
                    (Ok(gi), Ok(u)) => (gi, u),
                    (Err(e), _) | (_, Err(e)) => {
                        tracing::warn!(gpu = index, slot, error = %e, "cannot identify MIG device");
                        continue;
                    }
                };
                let ci_id = api.compute_instance_id(&mig).unwrap_or(0);
                let info = api
                    .gpu_instance_info(&g.handle, gi_id)
                    .map_err(|e| {
                        tracing::debug!(gpu = index, gi_id, error = %e, "GPU instance info unavailable; no placement, profile from the MIG device name");
                    })
                    .ok();
                let placement = info.as_ref().map(|i| MigPlacement {
                    profile_id: i.profile_id,
                    start: i.placement_start,
                    size: i.placement_size,
                });
                let profile = match info.and_then(|i| i.profile_name) {
                    Some(n) => Ok(n),
                    // The GPU instance path may need privileges; the MIG device's name
                    // ("NVIDIA A100-SXM4-40GB MIG 3g.20gb") carries the profile too.
                    None => api.name(&mig).map(|n| match n.find("MIG ") {
                        Some(at) => n[at..].to_owned(),
                        None => n,
                    }),
                }
                .map(|n| convert::mig_profile_name(&n))
                .unwrap_or_default();
                // One MIG device per GPU instance is exported (its first compute instance).
                if instances.iter().any(|i: &MigInstance| i.gi_id == gi_id) {
                    continue;
                }
                instances.push(MigInstance {
                    gi_id,
                    ci_id,
                    profile,
                    uuid,
                    placement,
                });
                handles.push((gi_id, mig));
            }
        }
        instances.sort_by_key(|i| i.gi_id);
        g.prev_mig_gpm
            .retain(|gi, _| handles.iter().any(|(h, _)| h == gi));
        g.mig = handles;
        (enabled, instances)
    }

    fn ensure_events(&self, ready: &mut Ready<A>) {
        let mut uuids: Vec<String> = ready.gpus.keys().cloned().collect();
        uuids.sort();
        let current = ready
            .events
            .as_ref()
            .is_some_and(|t| t.uuids == uuids && !t.thread.is_finished());
        if current || uuids.is_empty() {
            return;
        }
        ready.events = None; // stops the old thread
        let handles: Vec<A::Device> = uuids
            .iter()
            .filter_map(|u| ready.gpus.get(u).map(|g| g.handle.clone()))
            .collect();
        match ready.api.xid_events(&handles) {
            Ok((events, skipped)) => {
                for (i, e) in skipped {
                    tracing::warn!(gpu = %uuids.get(i).map_or("?", |s| s.as_str()), error = %e, "cannot watch XID events on this GPU");
                }
                let stop = Arc::new(AtomicBool::new(false));
                let (q, s) = (Arc::clone(&self.xids), Arc::clone(&stop));
                match std::thread::Builder::new()
                    .name("nvml-events".into())
                    .spawn(move || pump_events(events, &q, &s))
                {
                    Ok(thread) => {
                        ready.events = Some(EventThread {
                            uuids,
                            stop,
                            thread,
                        })
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot start the NVML event thread; XIDs are not recorded")
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot create an NVML event set; XIDs are not recorded");
            }
        }
    }
}

/// Reads one device. `Err(Lost)` when any call says the GPU fell off the bus.
fn read_device<A: NvmlApi>(
    api: &A,
    system: &[(StaticFact, Reading)],
    g: &mut GpuState<A>,
    device: &Device,
    fields: &[Field],
) -> Result<Result<DeviceSample, NvmlError>, Lost> {
    let h = g.handle.clone();
    let gpu_fields: Vec<Field> = fields
        .iter()
        .copied()
        .filter(|f| !device.mig_enabled || f.mig_scope() != MigScope::Unsupported)
        .collect();
    let plans: Vec<(Field, Plan)> = gpu_fields.iter().map(|&f| (f, convert::plan(f))).collect();

    // 1. The batched field-values call.
    let mut requests: Vec<FieldRequest> = Vec::new();
    for (_, p) in &plans {
        match p {
            Plan::FieldValue(id, _) => requests.push(FieldRequest { id: *id, scope: 0 }),
            Plan::NvlinkBandwidth => {
                for id in [
                    convert::fi::NVLINK_THROUGHPUT_DATA_TX,
                    convert::fi::NVLINK_THROUGHPUT_DATA_RX,
                ] {
                    requests.push(FieldRequest {
                        id,
                        scope: convert::ALL_LINKS,
                    });
                }
            }
            _ => {}
        }
    }
    requests.sort_by_key(|r| (r.id, r.scope));
    requests.dedup();
    let fv: HashMap<FieldRequest, api::FieldResult> = if requests.is_empty() {
        HashMap::new()
    } else {
        match check(api.field_values(&h, &requests))? {
            Ok(results) => requests.iter().copied().zip(results).collect(),
            Err(ApiError::NotSupported) => HashMap::new(),
            Err(cause) => {
                return Ok(Err(NvmlError::Call {
                    call: "nvmlDeviceGetFieldValues",
                    cause,
                }))
            }
        }
    };
    let fv_get = |id: u32, scope: u32| -> Result<&api::FieldResult, FieldError> {
        fv.get(&FieldRequest { id, scope })
            .ok_or(FieldError::NotSupported)
    };
    for r in fv.values() {
        if r.value == Err(ApiError::GpuLost) {
            return Err(Lost);
        }
    }

    // 2. GPM, if any profiling field is asked for.
    let metrics: Vec<GpmMetric> = {
        let mut m: Vec<GpmMetric> = plans
            .iter()
            .filter_map(|(_, p)| match p {
                Plan::Gpm(m) => Some(*m),
                _ => None,
            })
            .collect();
        m.sort();
        m.dedup();
        m
    };
    let gpm = if metrics.is_empty() || !g.gpm {
        HashMap::new()
    } else {
        let cur = check(api.gpm_sample(&h))?;
        gpm_delta(api, &mut g.prev_gpm, cur, &metrics)?
    };

    // 3. The calls without a field id, each made once however many fields it serves.
    let mut mem = None;
    let mut util = None;
    let mut readings = Vec::with_capacity(plans.len());
    for (f, p) in plans {
        let reading: Reading = match p {
            Plan::Static(fact) => system
                .iter()
                .chain(g.statics.iter())
                .find(|(s, _)| *s == fact)
                .map_or(Err(FieldError::NotSupported), |(_, r)| r.clone()),
            Plan::FieldValue(id, unit) => fv_get(id, 0).and_then(|r| match &r.value {
                Ok(v) => convert::field_value(*v, unit),
                Err(e) => Err(convert::field_error(e)),
            }),
            Plan::NvlinkBandwidth => {
                let tx = fv_get(convert::fi::NVLINK_THROUGHPUT_DATA_TX, convert::ALL_LINKS);
                let rx = fv_get(convert::fi::NVLINK_THROUGHPUT_DATA_RX, convert::ALL_LINKS);
                match (tx, rx) {
                    (Ok(tx), Ok(rx)) => match (&tx.value, &rx.value) {
                        (Ok(t), Ok(r)) => {
                            match (convert::as_counter(*t), convert::as_counter(*r)) {
                                (Some(t), Some(r)) => {
                                    let cur = NvlinkCounter {
                                        kib: t.saturating_add(r),
                                        timestamp_us: tx.timestamp_us.max(rx.timestamp_us),
                                    };
                                    let rate = convert::nvlink_bandwidth_mbps(g.prev_nvlink, cur);
                                    g.prev_nvlink = Some(cur);
                                    Ok(Value::Int(rate))
                                }
                                _ => Err(FieldError::Invalid),
                            }
                        }
                        (Err(e), _) | (_, Err(e)) => Err(convert::field_error(e)),
                    },
                    (Err(e), _) | (_, Err(e)) => Err(e),
                }
            }
            Plan::Memory(part) => once(&mut mem, || api.memory_info(&h))?
                .map(|m| convert::memory_value(&m, part))
                .map_err(|e| convert::field_error(&e)),
            Plan::Utilization(gpu) => once(&mut util, || api.utilization(&h))?
                .map(|(g, m)| Value::Int(i64::from(if gpu { g } else { m })))
                .map_err(|e| convert::field_error(&e)),
            Plan::EncoderUtil => int(check(api.encoder_utilization(&h))?),
            Plan::DecoderUtil => int(check(api.decoder_utilization(&h))?),
            Plan::Clock(kind) => int(check(api.clock(&h, kind))?),
            Plan::Temperature => int(check(api.temperature(&h))?),
            Plan::PowerUsage => watts(check(api.power_usage(&h))?),
            Plan::PowerLimit => watts(check(api.power_limit(&h))?),
            Plan::EnforcedPowerLimit => watts(check(api.enforced_power_limit(&h))?),
            Plan::Pstate => int(check(api.performance_state(&h))?),
            Plan::Fan => int(check(api.fan_speed(&h))?),
            Plan::PcieLinkGen => int(check(api.pcie_link_gen(&h))?),
            Plan::PcieLinkWidth => int(check(api.pcie_link_width(&h))?),
            Plan::ClocksEventReasons => check(api.clocks_event_reasons(&h))?
                .map_err(|e| convert::field_error(&e))
                .and_then(|m| {
                    i64::try_from(m)
                        .map(Value::Int)
                        .map_err(|_| FieldError::Invalid)
                }),
            Plan::Gpm(m) => gpm
                .get(&m)
                .cloned()
                .unwrap_or(Err(FieldError::NotSupported)),
            Plan::Derived | Plan::Unavailable => Err(FieldError::NotSupported),
        };
        readings.push((f, reading));
    }

    // 4. MIG instances: framebuffer on the MIG handle, GPM per GPU instance.
    let inst_fields: Vec<(Field, Plan)> = fields
        .iter()
        .filter(|f| f.mig_scope() == MigScope::Instance)
        .map(|&f| (f, convert::plan(f)))
        .collect();
    let mut instances = Vec::new();
    if device.mig_enabled && !inst_fields.is_empty() {
        let mig = g.mig.clone();
        for inst in &device.instances {
            let Some((_, mh)) = mig.iter().find(|(gi, _)| *gi == inst.gi_id) else {
                continue;
            };
            let mut mem: Option<Result<MemoryInfo, ApiError>> = None;
            let inst_metrics: Vec<GpmMetric> = inst_fields
                .iter()
                .filter_map(|(_, p)| match p {
                    Plan::Gpm(m) => Some(*m),
                    _ => None,
                })
                .collect();
            let igpm = if inst_metrics.is_empty() || !g.gpm {
                HashMap::new()
            } else {
                let cur = check(api.gpm_mig_sample(&h, inst.gi_id))?;
                let mut prev = g.prev_mig_gpm.remove(&inst.gi_id);
                let out = gpm_delta(api, &mut prev, cur, &inst_metrics)?;
                if let Some(p) = prev {
                    g.prev_mig_gpm.insert(inst.gi_id, p);
                }
                out
            };
            let mut rs = Vec::with_capacity(inst_fields.len());
            for (f, p) in &inst_fields {
                let r = match p {
                    Plan::Memory(part) => once(&mut mem, || api.memory_info(mh))?
                        .map(|m| convert::memory_value(&m, *part))
                        .map_err(|e| convert::field_error(&e)),
                    Plan::Gpm(m) => igpm
                        .get(m)
                        .cloned()
                        .unwrap_or(Err(FieldError::NotSupported)),
                    _ => Err(FieldError::NotSupported),
                };
                rs.push((*f, r));
            }
            instances.push(InstanceSample {
                gi_id: inst.gi_id,
                readings: rs,
            });
        }
    }
    Ok(Ok(DeviceSample {
        readings,
        instances,
    }))
}

fn watts(r: Result<u32, ApiError>) -> Reading {
    r.map(|mw| Value::Float(convert::milliwatts_to_watts(u64::from(mw))))
        .map_err(|e| convert::field_error(&e))
}

/// GPM metrics between the previous sample and `cur` (which becomes the previous one). The
/// first sample of a device has nothing to compare with: its fields are absent this tick.
fn gpm_delta<A: NvmlApi>(
    api: &A,
    prev: &mut Option<A::GpmSample>,
    cur: Result<A::GpmSample, ApiError>,
    metrics: &[GpmMetric],
) -> Result<HashMap<GpmMetric, Reading>, Lost> {
    let cur = match cur {
        Ok(c) => c,
        Err(e) => {
            let err = convert::field_error(&e);
            return Ok(metrics.iter().map(|&m| (m, Err(err))).collect());
        }
    };
    let out = match prev.as_ref() {
        None => HashMap::new(),
        Some(p) => match check(api.gpm_metrics(p, &cur, metrics))? {
            Ok(vals) => metrics
                .iter()
                .zip(vals)
                .map(|(&m, v)| {
                    let r = match v {
                        Ok(x) => convert::gpm_value(m, x),
                        Err(e) => Err(convert::field_error(&e)),
                    };
                    (m, r)
                })
                .collect(),
            Err(e) => {
                let err = convert::field_error(&e);
                metrics.iter().map(|&m| (m, Err(err))).collect()
            }
        },
    };
    *prev = Some(cur);
    Ok(out)
}

impl<A: NvmlApi> GpuSource for NvmlSource<A> {
    fn name(&self) -> &'static str {
        "nvml"
    }

    fn supports(&self, field: Field) -> bool {
        match convert::plan(field) {
            Plan::Unavailable => false,
            // Decided by the hardware at startup; kept while NVML was not up yet.
            Plan::Gpm(_) => self.gpm_decision.load(Ordering::Relaxed) != 2,
            _ => true,
        }
    }

    fn devices(&self) -> Result<Vec<Device>, SourceError> {
        let mut state = self.lock();
        let ready = self
            .ensure_ready(&mut state)
            .map_err(|e| SourceError::Discovery {
                cause: Box::new(NvmlError::NotInitialised(e)),
            })?;
        self.discover(ready)
    }

    fn sample(&self, device: &Device, fields: &[Field]) -> Result<DeviceSample, SourceError> {
        let index = device.identity.index;
        let uuid = device.identity.uuid.clone();
        let mut state = self.lock();
        let State::Ready(ready) = &mut *state else {
            let cause = match &*state {
                State::Pending { error, .. } => NvmlError::NotInitialised(error.clone()),
                State::Ready(_) => NvmlError::Unknown(uuid.clone()),
            };
            return Err(SourceError::Device {
                index,
                uuid,
                cause: Box::new(cause),
            });
        };
        let api = Arc::clone(&ready.api);
        let Some(g) = ready.gpus.get_mut(&uuid) else {
            return Err(SourceError::Device {
                index,
                uuid: uuid.clone(),
                cause: Box::new(NvmlError::Unknown(uuid)),
            });
        };
        match read_device(&*api, &ready.system, g, device, fields) {
            Ok(Ok(s)) => Ok(s),
            Ok(Err(e)) => Err(SourceError::Device {
                index,
                uuid,
                cause: Box::new(e),
            }),
            Err(Lost) => {
                // Deltas across a loss are meaningless.
                g.prev_gpm = None;
                g.prev_mig_gpm.clear();
                g.prev_nvlink = None;
                Err(SourceError::GpuLost { index, uuid })
            }
        }
    }

    fn drain_xids(&self) -> Vec<(String, XidEvent)> {
        std::mem::take(
            &mut *self
                .xids
                .items
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        )
    }
}

#[cfg(test)]
mod tests;
