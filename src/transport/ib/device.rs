//! Which HCA ports the plugin offers to NCCL: `NCCL_IB_HCA` filtering (NCCL's
//! syntax), port properties (speed, PCI path, GUID) and GID selection. The parsing
//! and arithmetic are pure and unit-tested; [`enumerate`] asks libibverbs.

use std::ffi::CStr;
use std::path::Path;

use super::verbs::loader::lib;
use super::verbs::sys::*;
use super::verbs::Context;

/// A parsed `NCCL_IB_HCA`: `[^][=]name[:port][,name[:port]...]`.
/// `^` excludes the listed devices instead of selecting them; `=` asks for exact
/// names instead of prefixes. Empty or unset selects everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HcaFilter {
    pub exclude: bool,
    pub exact: bool,
    pub entries: Vec<(String, Option<u8>)>,
}

impl HcaFilter {
    pub fn parse(s: &str) -> HcaFilter {
        let mut s = s.trim();
        let mut f = HcaFilter::default();
        if let Some(r) = s.strip_prefix('^') {
            f.exclude = true;
            s = r;
        }
        if let Some(r) = s.strip_prefix('=') {
            f.exact = true;
            s = r;
        }
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (name, port) = match item.split_once(':') {
                Some((n, p)) => (n, p.trim().parse().ok()),
                None => (item, None),
            };
            f.entries.push((name.to_string(), port));
        }
        f
    }

    /// Whether port `port` of device `dev` is offered.
    pub fn selects(&self, dev: &str, port: u8) -> bool {
        if self.entries.is_empty() {
            return true;
        }
        let hit = self.entries.iter().any(|(n, p)| {
            let name_ok = if self.exact {
                dev == n
            } else {
                dev.starts_with(n.as_str())
            };
            name_ok && p.is_none_or(|p| p == port)
        });
        hit != self.exclude
    }
}

/// Port speed in Mbps from `ibv_port_attr.active_speed` × `active_width` (the
/// encodings of the IB spec, as NCCL's net_ib tabulates them).
pub fn port_speed_mbps(active_speed: u8, active_width: u8) -> u32 {
    let lane = match active_speed {
        1 => 2_500,      // SDR
        2 => 5_000,      // DDR
        4 | 8 => 10_000, // QDR, FDR10
        16 => 14_000,    // FDR
        32 => 25_000,    // EDR
        64 => 50_000,    // HDR
        128 => 100_000,  // NDR
        _ => 10_000,
    };
    let width = match active_width {
        1 => 1,
        2 => 4,
        4 => 8,
        8 => 12,
        16 => 2,
        _ => 1,
    };
    lane * width
}

/// `/sys/class/infiniband/<dev>/node_guid` ("0002:c903:0045:aa10") as a number.
pub fn parse_guid(s: &str) -> Option<u64> {
    let hex: String = s.trim().chars().filter(|c| *c != ':').collect();
    (hex.len() == 16)
        .then(|| u64::from_str_radix(&hex, 16).ok())
        .flatten()
}

/// GID index for a RoCE port: `NCCL_IB_GID_INDEX` if set, else the first entry
/// whose sysfs type is "RoCE v2" and whose GID is an IPv4-mapped address (what
/// NCCL prefers), else the first RoCE v2 entry, else 0. `types[i]` is the type
/// string of index i and `gids[i]` its GID.
pub fn choose_gid(env: Option<u8>, types: &[String], gids: &[[u8; 16]]) -> u8 {
    if let Some(i) = env {
        return i;
    }
    let v2 = |i: usize| {
        types
            .get(i)
            .is_some_and(|t| t.trim().eq_ignore_ascii_case("RoCE v2"))
    };
    let v4 = |g: &[u8; 16]| g[..10].iter().all(|&b| b == 0) && g[10] == 0xff && g[11] == 0xff;
    (0..gids.len())
        .find(|&i| v2(i) && v4(&gids[i]))
        .or_else(|| (0..gids.len()).find(|&i| v2(i) && gids[i] != [0; 16]))
        .unwrap_or(0) as u8
}

/// One usable (active) HCA port.
#[derive(Clone, Debug)]
pub struct IbDevice {
    pub name: String,
    pub port: u8,
    pub speed_mbps: u32,
    pub pci_path: Option<String>,
    pub guid: u64,
    pub link_layer: u8,
    pub lid: u16,
    /// RoCE only.
    pub gid_index: Option<u8>,
}

fn sysfs(dev: &str, rest: &str) -> Option<String> {
    std::fs::read_to_string(Path::new("/sys/class/infiniband").join(dev).join(rest)).ok()
}

/// Active ports of every device that `filter` selects. `Err` says why IB is not
/// usable at all (no libibverbs, no devices), for the log line of `auto` mode.
pub fn enumerate(filter: &HcaFilter, gid_env: Option<u8>) -> Result<Vec<IbDevice>, String> {
    let l = lib()?;
    let mut n = 0;
    let mut names = Vec::new();
    // SAFETY: plain verbs calls; names are copied before the list is freed.
    unsafe {
        let list = (l.get_device_list)(&mut n);
        if list.is_null() {
            return Err(format!(
                "ibv_get_device_list: {}",
                std::io::Error::last_os_error()
            ));
        }
        for i in 0..n.max(0) as usize {
            names.push(
                CStr::from_ptr((l.get_device_name)(*list.add(i)))
                    .to_string_lossy()
                    .into_owned(),
            );
        }
        (l.free_device_list)(list);
    }
    if names.is_empty() {
        return Err("libibverbs found no RDMA device".into());
    }
    let mut out = Vec::new();
    for name in names {
        for port in 1..=nports(&name) {
            if !filter.selects(&name, port) {
                continue;
            }
            let Ok(ctx) = Context::open(&name, port) else {
                continue;
            };
            let Ok(a) = ctx.query_port() else { continue };
            if a.state != IBV_PORT_ACTIVE
                || !matches!(
                    a.link_layer,
                    IBV_LINK_LAYER_INFINIBAND | IBV_LINK_LAYER_ETHERNET
                )
            {
                continue;
            }
            let gid_index = (a.link_layer == IBV_LINK_LAYER_ETHERNET).then(|| {
                let n = a.gid_tbl_len.clamp(0, 256) as usize;
                let types: Vec<String> = (0..n)
                    .map(|i| {
                        sysfs(&name, &format!("ports/{port}/gid_attrs/types/{i}"))
                            .unwrap_or_default()
                    })
                    .collect();
                let gids: Vec<[u8; 16]> = (0..n)
                    .map(|i| ctx.query_gid(i as u8).map(|g| g.raw).unwrap_or([0; 16]))
                    .collect();
                choose_gid(gid_env, &types, &gids)
            });
            out.push(IbDevice {
                pci_path: std::fs::canonicalize(
                    Path::new("/sys/class/infiniband")
                        .join(&name)
                        .join("device"),
                )
                .ok()
                .map(|p| p.to_string_lossy().into_owned()),
                guid: sysfs(&name, "node_guid")
                    .and_then(|s| parse_guid(&s))
                    .unwrap_or(0),
                speed_mbps: port_speed_mbps(a.active_speed, a.active_width),
                link_layer: a.link_layer,
                lid: a.lid,
                gid_index,
                name: name.clone(),
                port,
            });
        }
    }
    Ok(out)
}

/// `dev:port` of every InfiniBand/RoCE port whose sysfs state is ACTIVE, read
/// under `root` (`/` on a host; a scratch directory in tests) from
/// `sys/class/infiniband/<dev>/ports/<port>/state` ("4: ACTIVE"). Loads no verbs
/// library: used with `NCCL_ZIP_TRANSPORT=tcp` only to tell the user that an
/// RDMA fabric is there.
pub fn active_ports_in_sysfs(root: &Path) -> Vec<String> {
    let base = root.join("sys/class/infiniband");
    let mut out = vec![];
    let Ok(devs) = std::fs::read_dir(&base) else {
        return out;
    };
    let mut devs: Vec<String> = devs
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    devs.sort();
    for dev in devs {
        let Ok(ports) = std::fs::read_dir(base.join(&dev).join("ports")) else {
            continue;
        };
        let mut ports: Vec<String> = ports
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .collect();
        ports.sort();
        for port in ports {
            let state =
                std::fs::read_to_string(base.join(&dev).join("ports").join(&port).join("state"))
                    .unwrap_or_default();
            if state.contains("ACTIVE") && !state.contains("INACTIVE") {
                out.push(format!("{dev}:{port}"));
            }
        }
    }
    out
}

/// Physical ports of a device, from sysfs (1 if unreadable: every HCA has port 1).
/// Paths whose presence means the HCA driver can register CUDA memory
/// (GPUDirect RDMA through peer memory): the nvidia-peermem module (current
/// drivers), or Mellanox's older nv_peer_mem, as NCCL's net_ib probes them.
pub const PEERMEM_PATHS: [&str; 4] = [
    "sys/module/nvidia_peermem",
    "sys/kernel/mm/memory_peers/nv_mem/version",
    "sys/kernel/mm/memory_peers/nv_mem_nc/version",
    "sys/module/nv_peer_mem",
];

/// Whether a peer-memory module for NVIDIA GPUs is loaded on this host.
pub fn peermem_loaded() -> bool {
    peermem_loaded_at(Path::new("/"))
}

/// [`peermem_loaded`] under `root` (tests use a scratch directory).
pub fn peermem_loaded_at(root: &Path) -> bool {
    PEERMEM_PATHS.iter().any(|p| root.join(p).exists())
}

fn nports(dev: &str) -> u8 {
    std::fs::read_dir(Path::new("/sys/class/infiniband").join(dev).join("ports"))
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u8>().ok())
                .max()
                .unwrap_or(1)
        })
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn active_ports_are_read_from_sysfs_without_verbs() {
        let root = std::env::temp_dir().join(format!("nzc_ibsysfs_{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let port = |dev: &str, p: u32, state: &str| {
            let d = root.join(format!("sys/class/infiniband/{dev}/ports/{p}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("state"), state).unwrap();
        };
        assert!(
            active_ports_in_sysfs(&root).is_empty(),
            "no sysfs tree: nothing"
        );
        port("mlx5_1", 1, "1: DOWN\n");
        port("mlx5_0", 1, "4: ACTIVE\n");
        port("mlx5_0", 2, "2: INIT\n");
        port("bnxt_re0", 1, "4: ACTIVE\n");
        assert_eq!(active_ports_in_sysfs(&root), vec!["bnxt_re0:1", "mlx5_0:1"]);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn hca_filter_follows_nccl_syntax() {
        let all = HcaFilter::parse("");
        assert!(all.selects("mlx5_0", 1));
        let f = HcaFilter::parse("mlx5");
        assert!(f.selects("mlx5_0", 1) && f.selects("mlx5_11", 2));
        assert!(!f.selects("bnxt_re0", 1));
        let f = HcaFilter::parse("=mlx5_1");
        assert!(f.selects("mlx5_1", 1));
        assert!(!f.selects("mlx5_10", 1), "= means exact");
        let f = HcaFilter::parse("^mlx5_0:1, mlx5_2");
        assert!(f.exclude);
        assert!(!f.selects("mlx5_0", 1));
        assert!(f.selects("mlx5_0", 2), "only port 1 is excluded");
        assert!(!f.selects("mlx5_2", 1) && !f.selects("mlx5_20", 1));
        assert!(f.selects("mlx5_1", 1));
        let f = HcaFilter::parse("^=mlx5_1");
        assert!(f.exclude && f.exact);
        assert!(!f.selects("mlx5_1", 1) && f.selects("mlx5_10", 1));
        assert_eq!(
            HcaFilter::parse("rxe0:1").entries,
            vec![("rxe0".to_string(), Some(1))]
        );
    }

    #[test]
    fn peermem_probe_finds_each_module_path() {
        let root = std::env::temp_dir().join(format!("nzip-peermem-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("sys/module/ib_core")).unwrap();
        assert!(!peermem_loaded_at(&root), "no peer-memory module");
        for p in PEERMEM_PATHS {
            let at = root.join(p);
            std::fs::create_dir_all(at.parent().unwrap()).unwrap();
            if p.ends_with("version") {
                std::fs::write(&at, "1.0\n").unwrap();
            } else {
                std::fs::create_dir_all(&at).unwrap();
            }
            assert!(peermem_loaded_at(&root), "{p}");
            std::fs::remove_dir_all(root.join("sys")).unwrap();
            assert!(!peermem_loaded_at(&root));
        }
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn speeds() {
        assert_eq!(port_speed_mbps(128, 2), 400_000, "NDR 4x");
        assert_eq!(port_speed_mbps(64, 2), 200_000, "HDR 4x");
        assert_eq!(port_speed_mbps(32, 2), 100_000, "EDR 4x");
        assert_eq!(port_speed_mbps(16, 2), 56_000, "FDR 4x");
        assert_eq!(port_speed_mbps(1, 1), 2_500, "SDR 1x");
        assert_eq!(port_speed_mbps(64, 16), 100_000, "HDR 2x");
    }

    #[test]
    fn guid_and_gid_choice() {
        assert_eq!(
            parse_guid("0002:c903:0045:aa10\n"),
            Some(0x0002_c903_0045_aa10)
        );
        assert_eq!(parse_guid("zz"), None);
        let v1 = "IB/RoCE v1".to_string();
        let v2 = "RoCE v2".to_string();
        let link_local = {
            let mut g = [0u8; 16];
            g[0] = 0xfe;
            g[1] = 0x80;
            g[15] = 1;
            g
        };
        let v4 = {
            let mut g = [0u8; 16];
            g[10] = 0xff;
            g[11] = 0xff;
            g[12..].copy_from_slice(&[10, 0, 0, 1]);
            g
        };
        let types = vec![v1.clone(), v2.clone(), v1, v2];
        let gids = vec![link_local, link_local, v4, v4];
        assert_eq!(choose_gid(None, &types, &gids), 3, "RoCE v2 + IPv4");
        assert_eq!(
            choose_gid(Some(2), &types, &gids),
            2,
            "NCCL_IB_GID_INDEX wins"
        );
        assert_eq!(choose_gid(None, &types[..2], &gids[..2]), 1, "any RoCE v2");
        assert_eq!(choose_gid(None, &[], &[]), 0);
    }
}
