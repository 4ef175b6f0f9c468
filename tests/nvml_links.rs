//! The NVML backend (over the fake NVML) for the newer fields: DCGM 4.7 base units read from the
//! same calls as the classic fields, and per-link NVLink fields read through NVML's per-link
//! scope, with the error counters on their own cadence (counted calls).

use std::collections::BTreeMap;
use std::time::Duration;

use gpu_exporter::catalog::Field;
use gpu_exporter::gpu::nvml::api::NvlinkErrorCounter;
use gpu_exporter::gpu::nvml::counting::{CallCounter, Counting};
use gpu_exporter::gpu::nvml::{NvmlSource, RetryPolicy};
use gpu_exporter::gpu::{Device, DeviceSample, GpuSource, LinkSample, Reading, SourceError, Value};
use gpu_exporter_testing::fake_nvml::{FakeGpu, FakeNvml};

const NOW: RetryPolicy = RetryPolicy {
    initial: Duration::ZERO,
    max: Duration::ZERO,
};

const LINK_FIELDS: &[Field] = &[
    Field::NvlinkCrcFlitErrorPerLinkTotal,
    Field::NvlinkCrcDataErrorPerLinkTotal,
    Field::NvlinkReplayErrorPerLinkTotal,
    Field::NvlinkRecoveryErrorPerLinkTotal,
    Field::NvlinkThroughputPerLink,
    Field::NvlinkTxThroughputPerLink,
    Field::NvlinkRxThroughputPerLink,
];

fn counted(
    fake: &FakeNvml,
    period: Duration,
) -> (NvmlSource<Counting<FakeNvml>>, std::sync::Arc<CallCounter>) {
    let api = Counting::new(fake.clone());
    let counter = api.counter();
    let src = NvmlSource::new(move || Ok(api.clone()), NOW).with_link_error_period(period);
    (src, counter)
}

fn device(src: &impl GpuSource) -> Device {
    src.devices().expect("devices").remove(0)
}

fn reading(s: &DeviceSample, f: Field) -> Reading {
    s.readings
        .iter()
        .find(|(g, _)| *g == f)
        .map(|(_, r)| r.clone())
        .unwrap_or_else(|| panic!("{f:?} not read"))
}

fn link_value(l: &LinkSample, f: Field) -> Reading {
    l.readings
        .iter()
        .find(|(g, _)| *g == f)
        .map(|(_, r)| r.clone())
        .unwrap_or_else(|| panic!("{f:?} not read on link {}", l.link))
}

fn calls(c: &CallCounter) -> BTreeMap<&'static str, u64> {
    c.take()
}

#[test]
fn base_unit_fields_share_the_classic_calls_and_get_their_units() {
    let fake = FakeNvml::new("570.172.08", vec![FakeGpu::h100(0)]);
    let (src, counter) = counted(&fake, Duration::from_secs(30));
    let d = device(&src);
    calls(&counter);
    let fields = [
        Field::SmClock,
        Field::SmClockHertz,
        Field::GpuUtil,
        Field::GpuUtilRatio,
        Field::MemCopyUtil,
        Field::MemoryUtilRatio,
        Field::FbUsed,
        Field::FbUsedBytes,
        Field::FbCapacityBytes,
        Field::TotalEnergyConsumption,
        Field::GpuEnergyJoulesTotal,
        Field::NvlinkBandwidthTotal,
        Field::NvlinkThroughputBytesPerSecond,
    ];
    let s = src.sample(&d, &fields).expect("sample");
    let int = |v| Ok(Value::Int(v));
    assert_eq!(reading(&s, Field::SmClock), int(1980));
    assert_eq!(reading(&s, Field::SmClockHertz), int(1_980_000_000));
    assert_eq!(reading(&s, Field::GpuUtil), int(75));
    assert_eq!(reading(&s, Field::GpuUtilRatio), Ok(Value::Float(0.75)));
    assert_eq!(reading(&s, Field::MemoryUtilRatio), Ok(Value::Float(0.3)));
    // 10 GiB used: 10240 MiB, or the exact bytes.
    assert_eq!(reading(&s, Field::FbUsed), int(10_240));
    assert_eq!(reading(&s, Field::FbUsedBytes), int(10_737_418_240));
    assert_eq!(reading(&s, Field::FbCapacityBytes), int(85_899_345_920));
    assert_eq!(reading(&s, Field::TotalEnergyConsumption), int(987_654));
    assert_eq!(reading(&s, Field::GpuEnergyJoulesTotal), int(987));
    // One utilization call and one memory call serve both generations.
    let c = calls(&counter);
    assert_eq!(c["nvmlDeviceGetUtilizationRates"], 1, "{c:?}");
    assert_eq!(c["nvmlDeviceGetMemoryInfo_v2"], 1, "{c:?}");

    // NVLink: both throughput fields from one reading of the counters, not a zero for the
    // second one.
    fake.update(|st| {
        let g = &mut st.gpus[0];
        g.nvlink_kib = Some((20_000_000, 10_000_000));
        g.timestamp_us += 30_000_000;
    });
    let s = src.sample(&d, &fields).expect("sample");
    // 30 000 000 KiB in 30 s = 1 000 000 KiB/s: 1000 "MB/s", 1 024 000 000 B/s.
    assert_eq!(reading(&s, Field::NvlinkBandwidthTotal), int(1000));
    assert_eq!(
        reading(&s, Field::NvlinkThroughputBytesPerSecond),
        int(1_024_000_000)
    );
}

#[test]
fn per_link_fields_cover_the_active_links_with_their_own_counters_and_rates() {
    let mut gpu = FakeGpu::h100(0);
    gpu.links[4].active = false;
    gpu.links[17].active = false;
    gpu.links[3].errors.insert(NvlinkErrorCounter::CrcFlit, 41);
    gpu.links[3].errors.insert(NvlinkErrorCounter::Replay, 5);
    gpu.links[9].errors.insert(NvlinkErrorCounter::Recovery, 2);
    gpu.links[9].errors.remove(&NvlinkErrorCounter::CrcData);
    let fake = FakeNvml::new("570.172.08", vec![gpu]);
    let (src, counter) = counted(&fake, Duration::ZERO);
    let d = device(&src);
    calls(&counter);

    let s = src.sample(&d, LINK_FIELDS).expect("sample");
    assert!(s.readings.is_empty(), "link fields are not GPU readings");
    let links: Vec<u32> = s.links.iter().map(|l| l.link).collect();
    let want: Vec<u32> = (0..18).filter(|l| *l != 4 && *l != 17).collect();
    assert_eq!(links, want);
    let link = |i: u32| s.links.iter().find(|l| l.link == i).expect("link");
    let int = |v| Ok(Value::Int(v));
    assert_eq!(
        link_value(link(3), Field::NvlinkCrcFlitErrorPerLinkTotal),
        int(41)
    );
    assert_eq!(
        link_value(link(3), Field::NvlinkReplayErrorPerLinkTotal),
        int(5)
    );
    assert_eq!(
        link_value(link(3), Field::NvlinkRecoveryErrorPerLinkTotal),
        int(0)
    );
    assert_eq!(
        link_value(link(9), Field::NvlinkRecoveryErrorPerLinkTotal),
        int(2)
    );
    assert_eq!(
        link_value(link(9), Field::NvlinkCrcDataErrorPerLinkTotal),
        Err(gpu_exporter::gpu::FieldError::NotSupported)
    );
    // The first throughput reading has no interval yet: 0, as DCGM publishes.
    assert_eq!(link_value(link(0), Field::NvlinkThroughputPerLink), int(0));
    // Link count field + one state call per link, one error call per active link and counter,
    // and one batched field-values call for every link's TX and RX.
    let c = calls(&counter);
    assert_eq!(c["nvmlDeviceGetNvLinkState"], 18, "{c:?}");
    assert_eq!(c["nvmlDeviceGetNvLinkErrorCounter"], 16 * 4, "{c:?}");
    assert_eq!(c["nvmlDeviceGetFieldValues"], 2, "{c:?}");

    fake.update(|st| {
        let g = &mut st.gpus[0];
        g.links[0].tx_kib = 3_000_000;
        g.links[0].rx_kib = 1_500_000;
        g.links[1].tx_kib = 30_000;
        g.timestamp_us += 30_000_000;
    });
    let s = src.sample(&d, LINK_FIELDS).expect("sample");
    let link = |i: u32| s.links.iter().find(|l| l.link == i).expect("link");
    // 4 500 000 KiB in 30 s = 150 000 KiB/s = 150 "MB/s" (÷ 1000, as DCGM).
    assert_eq!(
        link_value(link(0), Field::NvlinkThroughputPerLink),
        int(150)
    );
    assert_eq!(
        link_value(link(0), Field::NvlinkTxThroughputPerLink),
        int(100)
    );
    assert_eq!(
        link_value(link(0), Field::NvlinkRxThroughputPerLink),
        int(50)
    );
    assert_eq!(link_value(link(1), Field::NvlinkThroughputPerLink), int(1));
    assert_eq!(link_value(link(2), Field::NvlinkThroughputPerLink), int(0));
    // The link states are cached; the error counters (period zero here) are read again.
    let c = calls(&counter);
    assert!(!c.contains_key("nvmlDeviceGetNvLinkState"), "{c:?}");
    assert_eq!(c["nvmlDeviceGetNvLinkErrorCounter"], 16 * 4, "{c:?}");
    assert_eq!(c["nvmlDeviceGetFieldValues"], 1, "{c:?}");
}

#[test]
fn error_counters_are_read_on_their_own_slower_cadence() {
    let fake = FakeNvml::new("570.172.08", vec![FakeGpu::h100(0)]);
    let (src, counter) = counted(&fake, Duration::from_secs(3600));
    let d = device(&src);
    let fields = [Field::NvlinkReplayErrorPerLinkTotal, Field::GpuTemp];
    calls(&counter);
    let s = src.sample(&d, &fields).expect("sample");
    assert_eq!(s.links.len(), 18);
    assert_eq!(calls(&counter)["nvmlDeviceGetNvLinkErrorCounter"], 18);
    fake.update(|st| {
        st.gpus[0].links[2]
            .errors
            .insert(NvlinkErrorCounter::Replay, 9);
    });
    // Within the period: the last values are served, no error-counter call is made.
    for _ in 0..3 {
        let s = src.sample(&d, &fields).expect("sample");
        assert_eq!(
            link_value(&s.links[2], Field::NvlinkReplayErrorPerLinkTotal),
            Ok(Value::Int(0))
        );
        let c = calls(&counter);
        assert!(!c.contains_key("nvmlDeviceGetNvLinkErrorCounter"), "{c:?}");
        // Only the GPU-level call remains: the link fields cost nothing this tick.
        assert!(!c.contains_key("nvmlDeviceGetNvLinkState"), "{c:?}");
    }
    // Without link fields in the CSV, nothing NVLink-specific is called at all.
    let s = src.sample(&d, &[Field::GpuTemp]).expect("sample");
    assert!(s.links.is_empty());
    let c = calls(&counter);
    assert_eq!(
        c.keys().copied().collect::<Vec<_>>(),
        ["nvmlDeviceGetTemperature"]
    );
}

#[test]
fn a_gpu_without_nvlink_has_no_link_entities_and_a_lost_one_is_lost() {
    let mut pcie = FakeGpu::h100(0);
    pcie.links.clear();
    let fake = FakeNvml::new("570.172.08", vec![pcie, FakeGpu::h100(1)]);
    let (src, _) = counted(&fake, Duration::ZERO);
    let devs = src.devices().expect("devices");
    let s = src.sample(&devs[0], LINK_FIELDS).expect("sample");
    assert!(s.links.is_empty());
    let s = src.sample(&devs[1], LINK_FIELDS).expect("sample");
    assert_eq!(s.links.len(), 18);
    fake.update(|st| st.gpus[1].lost = true);
    assert!(matches!(
        src.sample(&devs[1], LINK_FIELDS),
        Err(SourceError::GpuLost { index: 1, .. })
    ));
}
