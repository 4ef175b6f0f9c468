//! What GPU events mean: dcgm-exporter's `err_msg` text of each XID and the clock-event reason
//! bits with their `clock_event` label values. Vocabulary of the GPU layer: the NVML event
//! reader logs the XID texts, and the health windows (`crate::health`) and the series use both.

/// Clock event reason bits (NVML `nvmlClocksEventReason*`) and dcgm-exporter's label values.
pub const CLOCK_EVENTS: &[(u64, &str)] = &[
    (0x1, "gpu_idle"),
    (0x2, "clocks_setting"),
    (0x4, "power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal"),
    (0x40, "hw_thermal"),
    (0x80, "hw_power_brake"),
    (0x100, "display_clocks"),
];

/// dcgm-exporter's `err_msg` text of every XID from 0 to 172, indexed by XID: the table of
/// NVIDIA/dcgm-exporter `internal/pkg/collector/xid_errors.go` as of commit 3446595 ("Update XID
/// error texts based off XID errors v580", #588), unchanged in releases 4.4.2-4.7.1 to
/// 4.5.3-4.8.2 and on its main branch at d5e5f51 (2026-05-12). The texts are label values:
/// alerts match them, so they are kept byte for byte (typos, `Unused` and `Reserved` included).
pub const XID_TEXTS: [&str; 173] = [
    "No Error",
    "Invalid or corrupted push buffer stream",
    "Invalid or corrupted push buffer stream",
    "Invalid or corrupted push buffer stream",
    "Invalid or corrupted push buffer stream",
    "Unused",
    "Invalid or corrupted push buffer stream",
    "Invalid or corrupted push buffer address",
    "GPU stopped processing",
    "Driver error programming GPU",
    "Unused",
    "Invalid or corrupted push buffer stream",
    "Driver error handling GPU exception",
    "Graphics Engine Exception",
    "Unused",
    "Unused",
    "Display engine hung",
    "Unused",
    "Bus mastering disabled in PCI Config Space",
    "Display Engine error",
    "Invalid or corrupted Mpeg push buffer",
    "Invalid or corrupted Motion Estimation push buffer",
    "Invalid or corrupted Video Processor push buffer",
    "Unused",
    "GPU semaphore timeout",
    "Invalid or illegal push buffer stream",
    "Framebuffer timeout",
    "Video processor exception",
    "Video processor exception",
    "Video processor exception",
    "GPU semaphore access error",
    "GPU memory page fault",
    "Invalid or corrupted push buffer stream",
    "Internal micro-controller error",
    "Video processor exception",
    "Video processor exception",
    "Video processor exception",
    "Driver firmware error",
    "Driver firmware error",
    "Unused",
    "Unused",
    "Unused",
    "Video processor exception",
    "GPU stopped processing",
    "Graphics Engine fault during context switch",
    "Preemptive cleanup, due to previous errors -- Most likely to see when running multiple cuda",
    "GPU stopped processing",
    "Video processor exception",
    "Double Bit ECC Error",
    "Unused",
    "Unused",
    "Unused",
    "Unused",
    "Unused",
    "Auxiliary power is not connected to the GPU board",
    "Unused",
    "Display Engine error",
    "Error programming video memory interface",
    "Unstable video memory interface detected",
    "Internal micro-controller error",
    "Video processor exception",
    "Internal micro-controller breakpoint/warning",
    "Internal micro-controller halt",
    "ECC page retirement or row remapping recording event",
    "ECC page retirement or row remapper recording failure",
    "Video processor exception",
    "Illegal access by driver",
    "Illegal access by driver",
    "NVDEC0 Exception",
    "Graphics Engine class error",
    "CE3: Unknown Error",
    "CE4: Unknown Error",
    "CE5: Unknown Error",
    "NVENC2 Error",
    "NVLINK Error",
    "CE6: Unknown Error",
    "CE7: Unknown Error",
    "CE8: Unknown Error",
    "vGPU Start Error",
    "GPU has fallen off the bus",
    "Corrupted data sent to GPU",
    "VGA Subsystem Error",
    "NVJPG0 Error",
    "NVDEC1 Error",
    "NVDEC2 Error",
    "CE9: Unknown Error",
    "OFA Exception",
    "Reserved",
    "NVDEC3 Error",
    "NVDEC4 Error",
    "Reserved",
    "Reserved",
    "High single-bit ECC error rate",
    "Non-fatal violation of provisioned InfoROM wear limit",
    "Contained ECC error",
    "Uncontained ECC error",
    "NVDEC5 Error",
    "NVDEC6 Error",
    "NVDEC7 Error",
    "NVJPG1 Error",
    "NVJPG2 Error",
    "NVJPG3 Error",
    "NVJPG4 Error",
    "NVJPG5 Error",
    "NVJPG6 Error",
    "NVJPG7 Error",
    "SMBPBI Test Message",
    "SMBPBI Test Message Silent",
    "Reserved",
    "Context Switch Timeout Error",
    "Security Fault Error",
    "Display Bundle Error Event",
    "Display Supervisor Error",
    "DP Link Training Error",
    "Display Pipeline Underflow Error",
    "Display Core Channel Error",
    "Display Window Channel Error",
    "Display Cursor Channel Error",
    "Display Pixel Pipeline Error",
    "GSP RPC Timeout",
    "GSP Error",
    "C2C Link Error",
    "SPI PMU RPC Read Failure",
    "SPI PMU RPC Write Failure",
    "SPI PMU RPC Erase Failure",
    "Inforom FS Failure",
    "Robust Channel CE10 Error",
    "Robust Channel CE11 Error",
    "Robust Channel CE12 Error",
    "Robust Channel CE13 Error",
    "Robust Channel CE14 Error",
    "Robust Channel CE15 Error",
    "Robust Channel CE16 Error",
    "Robust Channel CE17 Error",
    "Robust Channel CE18 Error",
    "Robust Channel CE19 Error",
    "ALI Training Fail",
    "NVLink Privilege Error",
    "Robust Channel DLA Error",
    "Robust Channel OFA1 Error",
    "Unrecovered ECC Error",
    "Robust Channel Fast Path Error",
    "Robust Channel NVENVC3 Error",
    "GPU Initialization Failure",
    "NVLINK: Saw Error",
    "NVLINK: RLW Error",
    "NVLINK: TLW Error",
    "NVLINK: TREX Error",
    "NVLINK: NVLPW_CTRL Error",
    "NVLINK: NETIR Error",
    "NVLINK: MSE Error",
    "Robust Channel Key rotation Error",
    "Robust Channel DLA SMMU Error",
    "Robust Channel DLA timeout Error",
    "GPU Recovery Action Changed",
    "NVLINK: SW Defined Error",
    "Resource Retirement Event",
    "Resource Retirement Failure",
    "GPU Fatal Timeout",
    "Robust Channel CHI Non-Data Error",
    "Channel Retirement Event",
    "Channel Retirement Failure",
    "Power Smoothing HW Circuitry Reengaged",
    "Power Smoothing HW Circuitry Disengaged",
    "Power Smoothing HW Circuitry Low Lifetime",
    "Power Smoothing HW Circuitry Lifetime Exhausted",
    "NVLINK Secure Crypto Error",
    "PCIE Fatal Timeout",
    "Reduced GPU Memory Capacity (Errors found in write protection region)",
    "Internal micro-controller halt",
    "NVLINK: Interrupt seen in CC mode",
    "Uncorrectable DRAM Error",
    "Uncorrectable SRAM Error",
];

/// The `err_msg` of an XID outside [`XID_TEXTS`] (dcgm-exporter's `unknownErr`).
pub const UNKNOWN_XID: &str = "Unknown Error";

/// The text dcgm-exporter attaches to an XID as `err_msg`.
pub fn xid_message(xid: u64) -> &'static str {
    usize::try_from(xid)
        .ok()
        .and_then(|i| XID_TEXTS.get(i))
        .copied()
        .unwrap_or(UNKNOWN_XID)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xid_texts_are_dcgm_exporters_table() {
        // Upstream's slice has an entry for every XID 0-172.
        assert_eq!(XID_TEXTS.len(), 173);
        assert_eq!(xid_message(0), "No Error");
        assert_eq!(xid_message(13), "Graphics Engine Exception");
        assert_eq!(
            xid_message(45),
            "Preemptive cleanup, due to previous errors -- Most likely to see when running multiple cuda"
        );
        assert_eq!(xid_message(79), "GPU has fallen off the bus");
        assert_eq!(xid_message(109), "Context Switch Timeout Error");
        assert_eq!(xid_message(140), "Unrecovered ECC Error");
        assert_eq!(xid_message(142), "Robust Channel NVENVC3 Error");
        assert_eq!(xid_message(154), "GPU Recovery Action Changed");
        assert_eq!(
            xid_message(168),
            "Reduced GPU Memory Capacity (Errors found in write protection region)"
        );
        assert_eq!(xid_message(172), "Uncorrectable SRAM Error");
        assert_eq!(xid_message(173), "Unknown Error");
        assert_eq!(xid_message(u64::MAX), "Unknown Error");
        // Every text is a plain label value: no escaping needed, no surrounding space.
        for (xid, t) in XID_TEXTS.iter().enumerate() {
            assert!(!t.is_empty() && t.trim() == *t, "{xid}: {t:?}");
            assert!(!t.contains(['"', '\\', '\n']), "{xid}: {t:?}");
        }
    }
}
