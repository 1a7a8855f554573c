//! Interface discovery and selection, following NCCL's socket transport rules.
//!
//! `NCCL_SOCKET_IFNAME` is a comma-separated list of name prefixes. A leading `^`
//! turns the list into an exclusion list; a leading `=` demands exact names (both
//! may combine as `^=`). Without it, NCCL prefers `ib*`, then anything except
//! `docker*`, `lo*` and `virbr*`, then `docker*`, and loopback only as a last resort.
//! Selection ([`select`]) is pure; [`discover`] feeds it the host's interfaces.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;

use crate::config::{Config, Family};

/// One interface as seen by the OS.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    pub name: String,
    pub addr: IpAddr,
    pub up: bool,
}

/// One device exposed to NCCL.
#[derive(Clone, Debug, PartialEq)]
pub struct Device {
    pub name: String,
    pub addr: IpAddr,
    /// Mbps, from /sys/class/net/<if>/speed, or [`DEFAULT_SPEED_MBPS`].
    pub speed_mbps: i32,
    /// realpath of /sys/class/net/<if>/device when the interface has one.
    pub pci_path: Option<String>,
}

impl Device {
    pub fn bind_addr(&self) -> SocketAddr {
        SocketAddr::new(self.addr, 0)
    }
}

/// NCCL's socket transport also assumes 10 Gb/s when the kernel reports nothing.
pub const DEFAULT_SPEED_MBPS: i32 = 10_000;

/// A parsed `NCCL_SOCKET_IFNAME`-style spec.
#[derive(Clone, Debug, PartialEq)]
pub struct IfSpec {
    exclude: bool,
    exact: bool,
    names: Vec<String>,
}

impl IfSpec {
    pub fn parse(s: &str) -> IfSpec {
        let mut rest = s.trim();
        let mut exclude = false;
        let mut exact = false;
        if let Some(r) = rest.strip_prefix('^') {
            exclude = true;
            rest = r;
        }
        if let Some(r) = rest.strip_prefix('=') {
            exact = true;
            rest = r;
        }
        // NCCL allows "name:port"; the port part is irrelevant to selection.
        let names = rest
            .split(',')
            .map(|n| n.split(':').next().unwrap_or("").trim().to_string())
            .filter(|n| !n.is_empty())
            .collect();
        IfSpec {
            exclude,
            exact,
            names,
        }
    }

    pub fn matches(&self, name: &str) -> bool {
        let hit = self.names.iter().any(|p| {
            if self.exact {
                name == p
            } else {
                name.starts_with(p.as_str())
            }
        });
        hit != self.exclude
    }
}

/// Picks devices from candidates: one per interface name, in first-seen order.
pub fn select(
    cands: &[Candidate],
    spec: Option<&str>,
    family: Option<Family>,
) -> Vec<(String, IpAddr)> {
    let usable: Vec<&Candidate> = cands
        .iter()
        .filter(|c| c.up)
        .filter(|c| {
            !matches!(
                (family, c.addr),
                (Some(Family::V4), IpAddr::V6(_)) | (Some(Family::V6), IpAddr::V4(_))
            )
        })
        // Link-local IPv6 needs a scope id that does not travel in a handle.
        .filter(|c| !matches!(c.addr, IpAddr::V6(a) if (a.segments()[0] & 0xffc0) == 0xfe80))
        .collect();
    let pick = |spec: &IfSpec| {
        let mut out: Vec<(String, IpAddr)> = Vec::new();
        for c in usable.iter().filter(|c| spec.matches(&c.name)) {
            match out.iter_mut().find(|(n, _)| *n == c.name) {
                // Prefer an IPv4 address when an interface has both (NCCL's default family).
                Some(slot) if slot.1.is_ipv6() && c.addr.is_ipv4() && family.is_none() => {
                    slot.1 = c.addr
                }
                Some(_) => {}
                None => out.push((c.name.clone(), c.addr)),
            }
        }
        out
    };
    if let Some(s) = spec {
        return pick(&IfSpec::parse(s));
    }
    for s in ["ib", "^docker,lo,virbr", "docker", "lo"] {
        let got = pick(&IfSpec::parse(s));
        if !got.is_empty() {
            return got;
        }
    }
    Vec::new()
}

/// Lists the host's interfaces and selects devices per `cfg`.
pub fn discover(cfg: &Config) -> std::io::Result<Vec<Device>> {
    let mut cands = Vec::new();
    for ifa in nix::ifaddrs::getifaddrs()? {
        let Some(addr) = ifa.address else { continue };
        let ip = if let Some(v4) = addr.as_sockaddr_in() {
            IpAddr::V4(v4.ip())
        } else if let Some(v6) = addr.as_sockaddr_in6() {
            IpAddr::V6(v6.ip())
        } else {
            continue;
        };
        let up = ifa.flags.contains(nix::net::if_::InterfaceFlags::IFF_UP);
        cands.push(Candidate {
            name: ifa.interface_name,
            addr: ip,
            up,
        });
    }
    let picked = select(&cands, cfg.socket_ifname.as_deref(), cfg.socket_family);
    Ok(picked
        .into_iter()
        .map(|(name, addr)| {
            let sys = Path::new("/sys/class/net").join(&name);
            let speed_mbps = std::fs::read_to_string(sys.join("speed"))
                .ok()
                .and_then(|s| s.trim().parse::<i32>().ok())
                .filter(|&s| s > 0)
                .unwrap_or(DEFAULT_SPEED_MBPS);
            let pci_path = std::fs::canonicalize(sys.join("device"))
                .ok()
                .map(|p| p.to_string_lossy().into_owned());
            Device {
                name,
                addr,
                speed_mbps,
                pci_path,
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(name: &str, addr: &str) -> Candidate {
        Candidate {
            name: name.into(),
            addr: addr.parse().unwrap(),
            up: true,
        }
    }

    fn names(v: Vec<(String, IpAddr)>) -> Vec<String> {
        v.into_iter().map(|(n, _)| n).collect()
    }

    fn host() -> Vec<Candidate> {
        vec![
            c("lo", "127.0.0.1"),
            c("eth0", "10.0.0.5"),
            c("eth0", "fd00::5"),
            c("docker0", "172.17.0.1"),
            c("eth10", "10.1.0.5"),
            c("virbr0", "192.168.122.1"),
            c("ens1", "fe80::1"),
        ]
    }

    #[test]
    fn default_prefers_ib_then_real_then_docker_then_lo() {
        let mut h = host();
        assert_eq!(names(select(&h, None, None)), ["eth0", "eth10"]);
        h.push(c("ib0", "10.2.0.5"));
        assert_eq!(names(select(&h, None, None)), ["ib0"]);
        let only_docker_lo = vec![c("lo", "127.0.0.1"), c("docker0", "172.17.0.1")];
        assert_eq!(names(select(&only_docker_lo, None, None)), ["docker0"]);
        assert_eq!(names(select(&[c("lo", "127.0.0.1")], None, None)), ["lo"]);
        assert!(select(&[], None, None).is_empty());
    }

    #[test]
    fn spec_prefix_exclude_exact() {
        let h = host();
        assert_eq!(names(select(&h, Some("eth"), None)), ["eth0", "eth10"]);
        assert_eq!(names(select(&h, Some("=eth0"), None)), ["eth0"]);
        assert_eq!(names(select(&h, Some("^eth,docker,virbr"), None)), ["lo"]);
        assert_eq!(
            names(select(&h, Some("^=eth0,lo,docker0,virbr0"), None)),
            ["eth10"]
        );
        assert_eq!(
            names(select(&h, Some("eth0:1234,lo"), None)),
            ["lo", "eth0"]
        );
    }

    #[test]
    fn one_device_per_interface_ipv4_preferred_family_honoured() {
        let h = vec![c("eth0", "fd00::5"), c("eth0", "10.0.0.5")];
        let got = select(&h, None, None);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].1, "10.0.0.5".parse::<IpAddr>().unwrap());
        let got = select(&h, None, Some(Family::V6));
        assert_eq!(got[0].1, "fd00::5".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn down_and_link_local_are_skipped() {
        let mut h = vec![
            c("eth0", "10.0.0.5"),
            c("ens1", "fe80::1"),
            c("lo", "127.0.0.1"),
        ];
        h[0].up = false;
        assert_eq!(names(select(&h, None, None)), ["lo"]);
    }

    #[test]
    fn discover_finds_loopback_here() {
        let cfg = Config {
            socket_ifname: Some("lo".into()),
            ..Config::default()
        };
        let devs = discover(&cfg).unwrap();
        assert_eq!(devs.len(), 1);
        assert!(devs[0].speed_mbps > 0);
    }
}
