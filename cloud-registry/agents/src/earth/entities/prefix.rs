//! IP networks (`addr/len`) as BGP events carry them and as the `prefix`
//! filter names them.

use std::net::IpAddr;

/// An IPv4 or IPv6 network (`addr/len`); a bare address is a /32 or /128.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IpPrefix {
    addr: IpAddr,
    len: u8,
}

impl IpPrefix {
    /// Parses `203.0.113.0/24`, `2001:db8::/32` or a bare address. Host bits
    /// are allowed (they are masked off).
    pub fn parse(text: &str) -> Option<IpPrefix> {
        let text = text.trim();
        let (addr, len) = match text.split_once('/') {
            Some((a, l)) => (
                a.trim().parse::<IpAddr>().ok()?,
                Some(l.trim().parse::<u8>().ok()?),
            ),
            None => (text.parse::<IpAddr>().ok()?, None),
        };
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let len = len.unwrap_or(max);
        (len <= max).then_some(IpPrefix { addr, len })
    }

    fn bits(&self) -> u128 {
        match self.addr {
            IpAddr::V4(a) => u128::from(u32::from(a)) << 96,
            IpAddr::V6(a) => u128::from(a),
        }
    }

    fn mask(len: u32) -> u128 {
        if len == 0 {
            0
        } else {
            u128::MAX << (128 - len)
        }
    }

    /// True when the two networks share at least one address (one contains
    /// the other).
    pub fn overlaps(&self, other: &IpPrefix) -> bool {
        if self.addr.is_ipv4() != other.addr.is_ipv4() {
            return false;
        }
        // IPv4 addresses sit in the top 32 bits, so a /n mask is the top n
        // bits for both families.
        let m = Self::mask(u32::from(self.len.min(other.len)));
        self.bits() & m == other.bits() & m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_overlap_when_one_contains_the_other() {
        let wide = IpPrefix::parse("61.80.0.0/14").unwrap();
        let narrow = IpPrefix::parse("61.80.160.0/20").unwrap();
        let other = IpPrefix::parse("61.84.0.0/16").unwrap();
        assert!(wide.overlaps(&narrow) && narrow.overlaps(&wide));
        assert!(!wide.overlaps(&other));
        let host = IpPrefix::parse("205.251.192.10").unwrap();
        assert!(host.overlaps(&IpPrefix::parse("205.251.192.0/24").unwrap()));
        assert!(!host.overlaps(&IpPrefix::parse("2001:db8::/32").unwrap()));
    }

    #[test]
    fn malformed_prefixes_are_refused() {
        assert!(IpPrefix::parse("10.0.0.0/33").is_none());
        assert!(IpPrefix::parse("not-an-ip").is_none());
    }
}
