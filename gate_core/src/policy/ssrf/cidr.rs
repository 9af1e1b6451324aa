//! CIDR ranges: the classification tables and the gate's `public_ranges` setting.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// An address range `addr/len` whose bits after the prefix are zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    len: u8,
}

/// Why a CIDR string was refused; the text names the value and what was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CidrError {
    #[error("invalid range {0:?}: expected a CIDR such as \"203.0.113.0/24\" or \"2001:db8:100::/48\"")]
    Syntax(String),
    #[error("invalid range {value:?}: the prefix length must be 0-{max}")]
    Length { value: String, max: u8 },
    #[error("invalid range {value:?}: bits are set after the prefix; write \"{fixed}\"")]
    HostBits { value: String, fixed: Cidr },
}

/// The top `len` of `bits` bits set (`bits` is 32 or 128), in a u128.
fn mask(len: u8, bits: u8) -> u128 {
    let (len, width) = (u32::from(len.min(bits)), u32::from(bits));
    let ones = u128::MAX.checked_shr(128 - len).unwrap_or(0);
    ones.checked_shl(width - len).unwrap_or(0)
}

fn bits_of(ip: IpAddr) -> (u128, u8) {
    match ip {
        IpAddr::V4(a) => (u128::from(u32::from(a)), 32),
        IpAddr::V6(a) => (u128::from(a), 128),
    }
}

impl Cidr {
    /// `a.b.c.d/len` (for tables; `len` must be at most 32 and the host bits zero).
    pub const fn v4(o: [u8; 4], len: u8) -> Cidr {
        Cidr { addr: IpAddr::V4(Ipv4Addr::new(o[0], o[1], o[2], o[3])), len }
    }

    /// An IPv6 range from its eight 16-bit groups (for tables).
    pub const fn v6(g: [u16; 8], len: u8) -> Cidr {
        Cidr { addr: IpAddr::V6(Ipv6Addr::new(g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7])), len }
    }

    /// True when `ip` is of the same family and within the range.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ((net, bits), (x, xbits)) = (bits_of(self.addr), bits_of(ip));
        bits == xbits && (net ^ x) & mask(self.len, bits) == 0
    }
}

impl FromStr for Cidr {
    type Err = CidrError;

    /// `addr/len` with `std`'s strict address syntax (no octal or short IPv4 forms) and
    /// the host bits zero, so a range means one thing only.
    fn from_str(s: &str) -> Result<Cidr, CidrError> {
        let syntax = || CidrError::Syntax(s.to_string());
        let (addr, len) = s.split_once('/').ok_or_else(syntax)?;
        let addr: IpAddr = addr.parse().map_err(|_| syntax())?;
        if len.is_empty() || len.len() > 3 || !len.bytes().all(|b| b.is_ascii_digit()) {
            return Err(syntax());
        }
        let (value, bits) = bits_of(addr);
        let len = len
            .parse::<u8>()
            .ok()
            .filter(|l| *l <= bits)
            .ok_or_else(|| CidrError::Length { value: s.to_string(), max: bits })?;
        let m = mask(len, bits);
        if value & !m != 0 {
            let fixed = match addr {
                IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::from(u32::try_from(value & m).unwrap_or(0))),
                IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::from(value & m)),
            };
            return Err(CidrError::HostBits { value: s.to_string(), fixed: Cidr { addr: fixed, len } });
        }
        Ok(Cidr { addr, len })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}
