//! Which IP addresses the outside-world tools and the egress proxy may connect to.
//!
//! Every address a name resolves to, and every IP literal in a URL, passes through
//! [`AddressPolicy::check`] before a socket is opened. IPv4 addresses hidden inside IPv6 ones
//! (IPv4-mapped `::ffff:a.b.c.d`, NAT64 `64:ff9b::/96`, 6to4 `2002::/16`) are unwrapped and
//! judged as IPv4, so `[::ffff:127.0.0.1]` is loopback. The operator may open explicit
//! exceptions (`egress.allow_cidrs`, e.g. an internal package mirror); cloud-metadata addresses
//! are refused even then, because no legitimate fetch needs the node's instance credentials.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

/// Why an address is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockedClass {
    /// `0.0.0.0/8`, `::`: "this host"; connecting to it reaches the local machine.
    Unspecified,
    /// `127.0.0.0/8`, `::1`.
    Loopback,
    /// RFC 1918 `10/8`, `172.16/12`, `192.168/16`.
    Private,
    /// `100.64.0.0/10` (carrier-grade NAT, also some cloud metadata endpoints).
    SharedCgnat,
    /// `169.254.0.0/16`, `fe80::/10`.
    LinkLocal,
    /// Instance-metadata endpoints of cloud providers (never excepted).
    CloudMetadata,
    /// `224.0.0.0/4`, `ff00::/8`.
    Multicast,
    /// `255.255.255.255`.
    Broadcast,
    /// IETF special-purpose, documentation, benchmarking and reserved ranges.
    Reserved,
    /// `fc00::/7` IPv6 unique-local (the IPv6 private range).
    UniqueLocal,
}

impl BlockedClass {
    /// The name used in error codes and audit rows.
    pub fn as_str(self) -> &'static str {
        match self {
            BlockedClass::Unspecified => "unspecified",
            BlockedClass::Loopback => "loopback",
            BlockedClass::Private => "private",
            BlockedClass::SharedCgnat => "cgnat",
            BlockedClass::LinkLocal => "link_local",
            BlockedClass::CloudMetadata => "cloud_metadata",
            BlockedClass::Multicast => "multicast",
            BlockedClass::Broadcast => "broadcast",
            BlockedClass::Reserved => "reserved",
            BlockedClass::UniqueLocal => "unique_local",
        }
    }
}

impl std::fmt::Display for BlockedClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An address that may not be contacted, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("address {address} is not reachable from here ({class} range)")]
pub struct Blocked {
    /// The address as given (before unwrapping).
    pub address: IpAddr,
    /// The range it falls in.
    pub class: BlockedClass,
}

/// The address rules of this node: the built-in blocked ranges minus the operator's exceptions.
#[derive(Debug, Clone, Default)]
pub struct AddressPolicy {
    exceptions: Vec<IpNet>,
}

impl AddressPolicy {
    /// A policy with explicit exceptions (`egress.allow_cidrs`); each is logged once here so an
    /// operator reading the log sees that internal ranges are reachable.
    pub fn new(exceptions: Vec<IpNet>) -> Self {
        for net in &exceptions {
            tracing::info!(cidr = %net, "egress: an internal range is reachable by configuration");
        }
        Self { exceptions }
    }

    /// Decides whether `address` may be contacted.
    pub fn check(&self, address: IpAddr) -> Result<(), Blocked> {
        let effective = unwrap_embedded_v4(address);
        let Some(class) = classify(effective) else {
            return Ok(());
        };
        let excepted = class != BlockedClass::CloudMetadata
            && self
                .exceptions
                .iter()
                .any(|net| net.contains(&effective) || net.contains(&address));
        if excepted {
            tracing::debug!(%address, class = %class, "egress: address allowed by an exception");
            return Ok(());
        }
        Err(Blocked { address, class })
    }
}

/// The IPv4 address an IPv6 address carries, for the forms that route to it; else itself.
pub fn unwrap_embedded_v4(address: IpAddr) -> IpAddr {
    let IpAddr::V6(v6) = address else {
        return address;
    };
    if let Some(v4) = v6.to_ipv4_mapped() {
        return IpAddr::V4(v4);
    }
    let s = v6.segments();
    let octets = v6.octets();
    // NAT64 well-known prefix 64:ff9b::/96.
    if s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0, 0, 0, 0] {
        return IpAddr::V4(Ipv4Addr::new(
            octets[12], octets[13], octets[14], octets[15],
        ));
    }
    // 6to4 2002:AABB:CCDD::/48 carries AA.BB.CC.DD.
    if s[0] == 0x2002 {
        return IpAddr::V4(Ipv4Addr::new(octets[2], octets[3], octets[4], octets[5]));
    }
    address
}

/// The blocked class of an (already unwrapped) address, or `None` when it is public.
pub fn classify(address: IpAddr) -> Option<BlockedClass> {
    match address {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

fn classify_v4(ip: Ipv4Addr) -> Option<BlockedClass> {
    let o = ip.octets();
    let u = u32::from(ip);
    let within = |net: u32, bits: u32| (u ^ net) >> (32 - bits) == 0;
    let class = if METADATA_V4.contains(&ip) {
        BlockedClass::CloudMetadata
    } else if o[0] == 0 {
        BlockedClass::Unspecified
    } else if o[0] == 127 {
        BlockedClass::Loopback
    } else if o[0] == 10 || within(0xac10_0000, 12) || within(0xc0a8_0000, 16) {
        BlockedClass::Private
    } else if within(0x6440_0000, 10) {
        BlockedClass::SharedCgnat
    } else if within(0xa9fe_0000, 16) {
        BlockedClass::LinkLocal
    } else if ip == Ipv4Addr::BROADCAST {
        BlockedClass::Broadcast
    } else if within(0xe000_0000, 4) {
        BlockedClass::Multicast
    } else if within(0xf000_0000, 4)          // reserved for future use
        || within(0xc000_0000, 24)            // 192.0.0.0/24 IETF protocol assignments
        || within(0xc000_0200, 24)            // 192.0.2.0/24 TEST-NET-1
        || within(0xc633_6400, 24)            // 198.51.100.0/24 TEST-NET-2
        || within(0xcb00_7100, 24)            // 203.0.113.0/24 TEST-NET-3
        || within(0xc612_0000, 15)            // 198.18.0.0/15 benchmarking
        || within(0xc058_6300, 24)
    // 192.88.99.0/24 6to4 relay anycast
    {
        BlockedClass::Reserved
    } else {
        return None;
    };
    Some(class)
}

/// Well-known IPv4 metadata endpoints: AWS/GCP/Azure/OpenStack, AWS ECS task metadata,
/// Alibaba Cloud, Oracle Cloud.
const METADATA_V4: [Ipv4Addr; 4] = [
    Ipv4Addr::new(169, 254, 169, 254),
    Ipv4Addr::new(169, 254, 170, 2),
    Ipv4Addr::new(100, 100, 100, 200),
    Ipv4Addr::new(192, 0, 0, 192),
];

/// AWS's IPv6 instance-metadata endpoint.
const METADATA_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x0254);

fn classify_v6(ip: Ipv6Addr) -> Option<BlockedClass> {
    let s = ip.segments();
    let class = if ip == METADATA_V6 {
        BlockedClass::CloudMetadata
    } else if ip.is_unspecified() {
        BlockedClass::Unspecified
    } else if ip.is_loopback() {
        BlockedClass::Loopback
    } else if s[0] & 0xfe00 == 0xfc00 {
        BlockedClass::UniqueLocal
    } else if s[0] & 0xffc0 == 0xfe80 || s[0] & 0xffc0 == 0xfec0 {
        // fe80::/10 link-local; fec0::/10 the deprecated site-local range.
        BlockedClass::LinkLocal
    } else if s[0] & 0xff00 == 0xff00 {
        BlockedClass::Multicast
    } else if s[0..6] == [0, 0, 0, 0, 0, 0]      // ::/96 IPv4-compatible (deprecated)
        || (s[0] == 0x64 && s[1] == 0xff9b)      // 64:ff9b::/16 NAT64, incl. the local-use /48
        || (s[0] == 0x100 && s[1..4] == [0, 0, 0]) // 100::/64 discard
        || (s[0] == 0x2001 && s[1] < 0x200)      // 2001::/23 IETF special (Teredo, benchmarking...)
        || (s[0] == 0x2001 && s[1] == 0xdb8)     // 2001:db8::/32 documentation
        || s[0] == 0x2002                        // 6to4 whose embedded IPv4 was public: still odd
        || s[0] == 0x3fff                        // 3fff::/20 documentation (RFC 9637)
        || s[0] & 0xe000 != 0x2000
    // outside 2000::/3, the only globally routed unicast block
    {
        BlockedClass::Reserved
    } else {
        return None;
    };
    Some(class)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(text: &str) -> Option<BlockedClass> {
        let ip: IpAddr = text.parse().expect("address");
        AddressPolicy::default().check(ip).err().map(|b| b.class)
    }

    #[test]
    fn every_blocked_class_is_refused() {
        use BlockedClass::*;
        for (ip, want) in [
            ("0.0.0.0", Unspecified),
            ("0.1.2.3", Unspecified),
            ("127.0.0.1", Loopback),
            ("127.255.0.9", Loopback),
            ("10.1.2.3", Private),
            ("172.16.0.1", Private),
            ("172.31.255.255", Private),
            ("192.168.1.1", Private),
            ("100.64.0.1", SharedCgnat),
            ("169.254.1.1", LinkLocal),
            ("169.254.169.254", CloudMetadata),
            ("100.100.100.200", CloudMetadata),
            ("224.0.0.1", Multicast),
            ("255.255.255.255", Broadcast),
            ("240.0.0.1", Reserved),
            ("192.0.2.1", Reserved),
            ("198.18.0.1", Reserved),
            ("::", Unspecified),
            ("::1", Loopback),
            ("fc00::1", UniqueLocal),
            ("fd12:3456::1", UniqueLocal),
            ("fe80::1", LinkLocal),
            ("ff02::1", Multicast),
            ("fd00:ec2::254", CloudMetadata),
            ("::ffff:127.0.0.1", Loopback),
            ("::ffff:a9fe:a9fe", CloudMetadata),
            ("::ffff:10.0.0.1", Private),
            ("64:ff9b::7f00:1", Loopback),
            ("2002:7f00:1::", Loopback),
            ("2001:db8::1", Reserved),
            ("::127.0.0.1", Reserved),
        ] {
            assert_eq!(class(ip), Some(want), "{ip}");
        }
    }

    #[test]
    fn public_addresses_pass() {
        for ip in ["93.184.215.14", "1.1.1.1", "172.32.0.1", "2606:4700::1111"] {
            assert_eq!(class(ip), None, "{ip}");
        }
    }

    #[test]
    fn exceptions_open_a_range_but_never_metadata() {
        let policy = AddressPolicy::new(vec![
            "127.0.0.2/32".parse().expect("net"),
            "169.254.0.0/16".parse().expect("net"),
        ]);
        assert!(policy.check("127.0.0.2".parse().expect("ip")).is_ok());
        assert!(policy
            .check("::ffff:127.0.0.2".parse().expect("ip"))
            .is_ok());
        assert!(policy.check("127.0.0.1".parse().expect("ip")).is_err());
        assert!(policy.check("169.254.1.1".parse().expect("ip")).is_ok());
        assert_eq!(
            policy
                .check("169.254.169.254".parse().expect("ip"))
                .map_err(|b| b.class),
            Err(BlockedClass::CloudMetadata)
        );
    }
}
