//! DCGM's C ABI without DCGM: a stand-in `libdcgm.so.4` written in C (`dcgm_standin.c`, built
//! here with the system C compiler, with DCGM 4.x's struct layouts, versions, return codes and
//! blank sentinels) is loaded through the exporter's real `dlopen` path (`gpu::dcgm::ffi`), and
//! what the exporter reads is compared with what the stand-in's "hostengine" holds: connect,
//! devices, latest values of GPUs and MIG GPU instances, blanks, a refused field, the hostengine
//! going away and coming back, the entity and field groups and watches, the profiling metric
//! groups, the MIG hierarchy and device attributes (`ffi.rs`); and, in `e2e.rs`, the exporter
//! binary with `-r` against this stand-in and the NVML stand-in of tests/nvml_abi together.

#[path = "../common/cstandin.rs"]
mod cstandin;
#[path = "../common/dcgm_hostengine.rs"]
mod dcgm_hostengine;
mod e2e;
#[path = "../nvml_abi/harness.rs"]
#[allow(dead_code)]
mod harness;
#[path = "../nvml_abi/node.rs"]
#[allow(dead_code)]
mod node;

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use gpu_exporter::catalog::Field;
use gpu_exporter::gpu::dcgm::source::{DcgmOptions, DcgmSource};
use gpu_exporter::gpu::dcgm::{
    self, reading, status, DcgmLibrary, Entity, EntityGroup, LatestValue,
};
use gpu_exporter::gpu::sim::scenario::Scenario;
use gpu_exporter::gpu::sim::SimulatedSource;
use gpu_exporter::gpu::{
    Device, DeviceSample, FieldError, FieldGap, GpuSource, SourceError, Value, XidEvent,
};

/// The stand-in reads its configuration from the process environment: the tests of this
/// process that load it in-process take turns.
fn env_lock() -> MutexGuard<'static, ()> {
    static ENV: Mutex<()> = Mutex::new(());
    ENV.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Builds the stand-in once per test process; returns the library's path.
fn library() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        cstandin::build(
            "dcgm-abi",
            "tests/dcgm_abi/dcgm_standin.c",
            "libdcgm.so.4",
            &[],
        )
    })
}

/// The stand-in's configuration file: written by the test, re-read by every call.
struct Hostengine {
    _dir: tempfile::TempDir,
    config: PathBuf,
}

impl Hostengine {
    fn new(text: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = dir.path().join("hostengine.conf");
        std::fs::write(&config, text).expect("write the stand-in configuration");
        Self { _dir: dir, config }
    }

    fn set(&self, text: &str) {
        std::fs::write(&self.config, text).expect("rewrite the stand-in configuration");
    }
}

const A100: &str = "hostengine = up
gpus = 2
uuid.0 = GPU-aaaa
uuid.1 = GPU-bbbb
mig.0 = 1 3 2
mig.1 = 1 4 9
metricgroup.0 = 1 0 1001 1004 1005 1003
metricgroup.1 = 1 1 1002
metricgroup.2 = 2 0 1009 1010
value.1.0.1001 = 0.625
value.1.0.1004 = 0.125
value.1.1.1001 = 0.5
value.4.3.1001 = 0.25
refuse.1005 = 1
";

const GR_ENGINE_ACTIVE: u16 = 1001;
const PIPE_TENSOR_ACTIVE: u16 = 1004;
const DRAM_ACTIVE: u16 = 1005;
const SM_OCCUPANCY: u16 = 1003;
const SM_ACTIVE: u16 = 1002;

fn find(values: &[LatestValue], group: EntityGroup, id: u32, field: u16) -> LatestValue {
    *values
        .iter()
        .find(|v| v.entity.group == group && v.entity.id == id && v.field_id == field)
        .unwrap_or_else(|| panic!("no value for {group:?} {id} field {field}: {values:#?}"))
}

#[test]
fn the_real_dlopen_path_reads_what_the_hostengine_holds_and_survives_it_going_away() {
    let _env = env_lock();
    let he = Hostengine::new(A100);
    std::env::set_var("DCGM_STANDIN_CONFIG", &he.config);
    let lib =
        DcgmLibrary::open(library().to_str().expect("utf-8 path")).expect("load the stand-in");

    // Connect (the stand-in rejects any other dcgmConnectV2Params version) and list GPUs.
    let conn = lib.connect("127.0.0.1:5555", false, 1000).expect("connect");
    assert_eq!(conn.gpu_ids().expect("dcgmGetAllDevices"), [0, 1]);

    // Identity: UUIDs through dcgmDeviceAttributes_v3, MIG through dcgmMigHierarchy_v2 (the
    // stand-in rejects any other version of either).
    assert_eq!(
        conn.gpu_uuid(1).expect("dcgmGetDeviceAttributes"),
        "GPU-bbbb"
    );
    let mig = conn.mig_hierarchy().expect("dcgmGetGpuInstanceHierarchy");
    assert_eq!(mig.len(), 2);
    assert_eq!(
        (
            mig[1].entity,
            mig[1].parent,
            mig[1].gpu_uuid.as_str(),
            mig[1].instance_id
        ),
        (
            Entity {
                group: EntityGroup::GpuInstance,
                id: 4
            },
            Entity {
                group: EntityGroup::Gpu,
                id: 1
            },
            "GPU-bbbb",
            9
        )
    );
    // Profiling metric groups (dcgmProfGetMetricGroups_v3).
    let groups = conn
        .metric_groups(0)
        .expect("dcgmProfGetSupportedMetricGroups");
    assert_eq!(groups.len(), 3);
    assert_eq!(
        (
            groups[0].major,
            groups[0].minor,
            groups[0].fields.as_slice()
        ),
        (1, 0, &[1001, 1004, 1005, 1003][..])
    );
    assert_eq!(
        (
            groups[1].major,
            groups[1].minor,
            groups[1].fields.as_slice()
        ),
        (1, 1, &[1002][..])
    );

    let entities = [
        Entity {
            group: EntityGroup::Gpu,
            id: 0,
        },
        Entity {
            group: EntityGroup::Gpu,
            id: 1,
        },
        Entity {
            group: EntityGroup::GpuInstance,
            id: 3,
        },
    ];
    let fields = [
        GR_ENGINE_ACTIVE,
        PIPE_TENSOR_ACTIVE,
        DRAM_ACTIVE,
        SM_OCCUPANCY,
    ];
    // Before a watch, nothing reads: DCGM_ST_NOT_WATCHED.
    let values = conn.latest(&entities, &fields).expect("unwatched read");
    assert!(
        values.iter().all(|v| v.status == status::NOT_WATCHED),
        "{values:#?}"
    );

    // Groups and a watch. Two metric groups of one major cannot be watched together.
    let group = conn.create_group("g", &entities).expect("dcgmGroupCreate");
    let multi = conn
        .create_field_group("multi", &[GR_ENGINE_ACTIVE, SM_ACTIVE])
        .expect("dcgmFieldGroupCreate");
    let e = conn
        .watch(group, multi, 200_000, 2)
        .expect_err("multi-pass");
    assert_eq!(
        e.to_string(),
        "dcgmWatchFields returned DCGM_ST_PROFILING_MULTI_PASS (-38)"
    );
    conn.destroy_field_group(multi)
        .expect("dcgmFieldGroupDestroy");
    let fg = conn.create_field_group("f", &fields).expect("field group");
    conn.watch(group, fg, 200_000, 2).expect("dcgmWatchFields");

    // Latest values: whole GPUs and a MIG GPU instance, exact; the stand-in rejects entries
    // without dcgmFieldValue_version2, and the entity group numbers are DCGM's (GPU_I = 4).
    let values = conn
        .latest(&entities, &fields)
        .expect("dcgmEntitiesGetLatestValues");
    assert_eq!(values.len(), 12);
    let r = |g, id, f| reading(&find(&values, g, id, f));
    assert_eq!(
        r(EntityGroup::Gpu, 0, GR_ENGINE_ACTIVE),
        Ok(Value::Float(0.625))
    );
    assert_eq!(
        r(EntityGroup::Gpu, 0, PIPE_TENSOR_ACTIVE),
        Ok(Value::Float(0.125))
    );
    assert_eq!(
        r(EntityGroup::Gpu, 1, GR_ENGINE_ACTIVE),
        Ok(Value::Float(0.5))
    );
    assert_eq!(
        r(EntityGroup::GpuInstance, 3, GR_ENGINE_ACTIVE),
        Ok(Value::Float(0.25))
    );
    // Not held: DCGM_FP64_BLANK with DCGM_ST_NO_DATA, a failed read (no series).
    let blank = find(&values, EntityGroup::Gpu, 1, SM_OCCUPANCY);
    assert_eq!(blank.status, status::NO_DATA);
    assert_eq!(blank.value, dcgm::RawValue::Double(dcgm::blank::FP64));
    assert_eq!(reading(&blank), Err(FieldError::Failed));
    // A field the hostengine refuses: DCGM_FP64_NOT_SUPPORTED, not supported.
    assert_eq!(
        r(EntityGroup::Gpu, 0, DRAM_ACTIVE),
        Err(FieldError::NotSupported)
    );

    // A library that leaves an entity's entries unfilled (issue 35 item 3): they stay "no
    // data" of that entity; none lands on entity 0 (the id of an all-zero entry).
    he.set(&format!("{A100}skip.1.1 = 1\n"));
    let values = conn
        .latest(&entities, &fields)
        .expect("a partly filled answer");
    assert_eq!(values.len(), 12);
    let of = |e: Entity| values.iter().filter(move |v| v.entity == e);
    assert_eq!(of(entities[0]).count(), 4, "{values:#?}");
    assert_eq!(of(entities[1]).count(), 4, "{values:#?}");
    for v in of(entities[1]) {
        assert_eq!(v.status, status::NO_DATA, "{v:?}");
        assert_eq!(reading(v), Err(FieldError::Failed), "{v:?}");
    }
    assert_eq!(
        reading(&find(&values, EntityGroup::Gpu, 0, GR_ENGINE_ACTIVE)),
        Ok(Value::Float(0.625))
    );
    he.set(A100);

    conn.unwatch(group, fg).expect("dcgmUnwatchFields");
    let values = conn.latest(&entities[..1], &fields[..1]).expect("read");
    assert_eq!(values[0].status, status::NOT_WATCHED);
    conn.watch(group, fg, 200_000, 2).expect("watch again");

    // The hostengine goes away: calls on the connection and new connections say so.
    he.set("hostengine = down\n");
    let e = conn
        .latest(&entities, &fields)
        .expect_err("hostengine down");
    assert!(e.connection_lost(), "{e}");
    assert_eq!(
        e.to_string(),
        "dcgmEntitiesGetLatestValues returned DCGM_ST_CONNECTION_NOT_VALID (-21)"
    );
    let e = lib
        .connect("127.0.0.1:5555", false, 1000)
        .expect_err("no hostengine");
    assert!(e.connection_lost(), "{e}");

    // It comes back restarted (a new epoch): the old handle stays invalid and the watches are
    // gone; a new connection watches and reads again.
    he.set(&format!("{A100}epoch = 1\n"));
    let e = conn.gpu_ids().expect_err("a handle of the old hostengine");
    assert!(e.connection_lost(), "{e}");
    drop(conn);
    let conn = lib
        .connect("127.0.0.1:5555", false, 1000)
        .expect("reconnect");
    let values = conn
        .latest(&entities[..1], &[GR_ENGINE_ACTIVE])
        .expect("read");
    assert_eq!(values[0].status, status::NOT_WATCHED);
    let group = conn.create_group("g", &entities[..1]).expect("group");
    let fg = conn
        .create_field_group("f", &[GR_ENGINE_ACTIVE])
        .expect("field group");
    conn.watch(group, fg, 200_000, 2).expect("watch");
    let values = conn
        .latest(&entities[..1], &[GR_ENGINE_ACTIVE])
        .expect("read again");
    assert_eq!(reading(&values[0]), Ok(Value::Float(0.625)));
}
#[test]
fn a_missing_library_names_what_to_install() {
    let e = DcgmLibrary::open("/nonexistent/libdcgm.so.4").expect_err("no library");
    let text = e.to_string();
    assert!(text.contains("/nonexistent/libdcgm.so.4"), "{text}");
    assert!(text.contains("datacenter-gpu-manager-4-core"), "{text}");
    assert!(text.contains("image variant with DCGM"), "{text}");
}

/// Several simulated nodes' GPUs as one source: more GPUs and MIG instances than one profile
/// has.
struct Fleet(Vec<(SimulatedSource, Vec<String>)>);

impl Fleet {
    fn new(profiles: &[(&str, u64)]) -> Self {
        Self(
            profiles
                .iter()
                .map(|&(profile, seed)| {
                    let s = SimulatedSource::new(
                        profile,
                        seed,
                        Duration::from_secs(1),
                        Scenario::default(),
                        "-",
                    )
                    .expect("profile");
                    let uuids = s
                        .devices()
                        .expect("devices")
                        .into_iter()
                        .map(|d| d.identity.uuid)
                        .collect();
                    (s, uuids)
                })
                .collect(),
        )
    }

    fn owner(&self, d: &Device) -> &SimulatedSource {
        &self
            .0
            .iter()
            .find(|(_, uuids)| uuids.contains(&d.identity.uuid))
            .expect("a device of the fleet")
            .0
    }
}

impl GpuSource for Fleet {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn supports(&self, field: Field) -> bool {
        self.0[0].0.supports(field)
    }

    fn field_gap(&self, device: &Device, field: Field) -> Option<FieldGap> {
        self.owner(device).field_gap(device, field)
    }

    fn devices(&self) -> Result<Vec<Device>, SourceError> {
        let mut all = Vec::new();
        for (s, _) in &self.0 {
            all.extend(s.devices()?);
        }
        Ok(all)
    }

    fn sample(&self, device: &Device, fields: &[Field]) -> Result<DeviceSample, SourceError> {
        self.owner(device).sample(device, fields)
    }

    fn drain_xids(&self) -> Vec<(String, XidEvent)> {
        Vec::new()
    }
}

#[test]
fn more_entities_than_one_dcgm_group_holds_are_watched_in_groups_of_64() {
    // Issue 35 item 3: DCGM holds at most 64 entities in a group (the stand-in too). 8 A100s
    // with 7 MIG instances each and 4 with MIG are more than 64 GPUs and GPU instances.
    let _env = env_lock();
    let fleet = Fleet::new(&[("8xA100-80GB-7xMIG", 1), ("4xA100-80GB-MIG", 2)]);
    let devices = fleet.devices().expect("devices");
    let dir = tempfile::tempdir().expect("tempdir");
    let (conf, entities) = dcgm_hostengine::hostengine(&devices, dir.path());
    assert!(entities.len() > 64, "{} entities", entities.len());
    let status_file = dir.path().join("calls");
    std::env::set_var("DCGM_STANDIN_CONFIG", &conf);
    std::env::set_var("DCGM_STANDIN_STATUS", &status_file);
    let path = library().to_str().expect("utf-8 path");
    let mut opts = DcgmOptions::new("127.0.0.1:5555", Duration::from_millis(100));
    opts.library = path.to_owned();
    let source = DcgmSource::new(fleet, opts).expect("start the DCGM source");
    // Discovery tells the reader which devices to watch.
    assert_eq!(source.devices().expect("devices"), devices);
    let fields: Vec<Field> = dcgm_hostengine::PROF
        .iter()
        .filter_map(|&f| Field::from_id(f))
        .collect();
    let served = |source: &DcgmSource<Fleet>| {
        let mut ok = 0;
        let mut asked = 0;
        for d in &devices {
            let s = source.sample(d, &fields).expect("sample");
            let inst = s.instances.iter().flat_map(|i| i.readings.iter());
            for (f, r) in s.readings.iter().chain(inst) {
                if f.id() == 1001 {
                    asked += 1;
                    ok += usize::from(r.is_ok());
                }
            }
        }
        (ok, asked)
    };
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let (ok, asked) = served(&source);
        if asked > 0 && ok == asked {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "graphics activity served on {ok} of {asked} GPUs and instances; DCGM errors: watch {}, entities {}",
            source.metrics().errors("watch"),
            source.metrics().errors("entities"),
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let counters = std::fs::read_to_string(&status_file).expect("the stand-in's counters");
    let live = |k: &str| {
        counters
            .lines()
            .filter_map(|l| l.split_once(" = "))
            .find(|(key, _)| *key == k)
            .and_then(|(_, v)| v.trim().parse::<usize>().ok())
    };
    assert_eq!(
        live("live.groups"),
        Some(entities.len().div_ceil(64)),
        "{counters}"
    );
    assert_eq!(live("live.field_groups"), Some(1), "{counters}");
    assert_eq!(source.metrics().errors("watch"), 0);
}
