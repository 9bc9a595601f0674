//! `geo [$address] $var { ... }`: a variable whose value depends on an
//! IP address (nginx's `ngx_http_geo_module`).
//!
//! The block is compiled once into a [`GeoVar`] that the variable table
//! evaluates whenever the variable is read. The address is the client's
//! (`$remote_addr`, so after realip) or the value of the given variable;
//! when the client is one of the block's `proxy` networks, the address is
//! taken from `X-Forwarded-For` instead (its last address, or with
//! `proxy_recursive` the last one that is not a proxy). An address that
//! does not parse looks up `255.255.255.255`, as in nginx.
//!
//! Two kinds of table, as nginx has:
//! - networks (`CIDR value;`, IPv4 and IPv6): longest prefix wins; kept as
//!   one hash map per prefix length in use, tried from the longest;
//!   `default` is `0.0.0.0/0` and `::/0`; `delete CIDR` removes an entry;
//! - `ranges` (`A.B.C.D-E.F.G.H value;`, IPv4 only): nginx cuts every
//!   range at 64K boundaries and keeps each block's pieces sorted; a new
//!   range may lie inside an older one (it wins there) or equal it (it
//!   replaces it, with a warning), any other overlap is an error naming
//!   the piece it hits. Kept here the same way, so the errors are nginx's.
//!
//! `include FILE` inside the block is expanded by the parser.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use super::map::{define, no_block, var_name};
use crate::config::registry::{arg, ctx, Args, Setter, Spec};
use crate::config::{ConfError, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::http::conf::HttpMain;
use crate::http::vars::{UserVar, Var, VarCtx};

pub const DIRECTIVES: &[Spec] = &[Spec {
    name: "geo",
    ctx: ctx::HTTP,
    args: Args::take12(),
    set: Setter::HttpMainBlock(set_geo),
}];

/// Networks of one address family: prefix length -> masked address ->
/// value index; lengths in use from the longest.
#[derive(Debug, Default)]
struct Prefixes {
    by_len: BTreeMap<u8, HashMap<u128, usize>>,
}

impl Prefixes {
    fn mask(addr: u128, len: u8, bits: u8) -> u128 {
        if len == 0 {
            0
        } else {
            let m = (u128::MAX >> (128 - u32::from(bits))) << (bits - len);
            addr & m
        }
    }

    /// Inserts; the value it replaced, if any.
    fn insert(&mut self, addr: u128, len: u8, v: usize) -> Option<usize> {
        self.by_len.entry(len).or_default().insert(addr, v)
    }

    fn remove(&mut self, addr: u128, len: u8) -> bool {
        self.by_len
            .get_mut(&len)
            .is_some_and(|m| m.remove(&addr).is_some())
    }

    fn find(&self, addr: u128, bits: u8) -> Option<usize> {
        self.by_len
            .iter()
            .rev()
            .find_map(|(len, m)| m.get(&Self::mask(addr, *len, bits)).copied())
    }
}

/// One piece of a range inside a 64K block: low 16 bits, inclusive.
#[derive(Debug, Clone, Copy)]
struct Piece {
    start: u16,
    end: u16,
    value: usize,
}

#[derive(Debug)]
enum Table {
    Cidr {
        v4: Prefixes,
        v6: Prefixes,
    },
    Ranges {
        /// High 16 bits -> sorted pieces.
        blocks: HashMap<u16, Vec<Piece>>,
        default: Option<usize>,
    },
}

/// A compiled `geo` block.
#[derive(Debug)]
struct GeoVar {
    /// The address variable; `None`: the client's address.
    source: Option<Var>,
    proxies: Vec<(IpAddr, u8)>,
    recursive: bool,
    values: Vec<Vec<u8>>,
    table: Table,
}

fn in_net(ip: IpAddr, net: &(IpAddr, u8)) -> bool {
    let (a, n) = (key(ip), key(net.0));
    match (a, n) {
        ((x, 32), (y, 32)) => Prefixes::mask(x, net.1, 32) == Prefixes::mask(y, net.1, 32),
        ((x, 128), (y, 128)) => Prefixes::mask(x, net.1, 128) == Prefixes::mask(y, net.1, 128),
        _ => false,
    }
}

/// The lookup key: an IPv4 (also IPv4-mapped IPv6) address as 32 bits,
/// else 128.
fn key(ip: IpAddr) -> (u128, u8) {
    match ip {
        IpAddr::V4(a) => (u128::from(u32::from(a)), 32),
        IpAddr::V6(a) => match a.to_ipv4_mapped() {
            Some(v4) => (u128::from(u32::from(v4)), 32),
            None => (u128::from(a), 128),
        },
    }
}

/// nginx's `ngx_parse_addr_port` of one X-Forwarded-For element: an
/// address, optionally with a port (`1.2.3.4:80`, `[::1]:80`).
fn parse_with_port(s: &str) -> Option<IpAddr> {
    if let Ok(ip) = s.parse() {
        return Some(ip);
    }
    if let Some(rest) = s.strip_prefix('[') {
        let (a, port) = rest.split_once("]:")?;
        port.parse::<u16>().ok()?;
        return a.parse().ok();
    }
    let (a, port) = s.rsplit_once(':')?;
    port.parse::<u16>().ok()?;
    a.parse::<Ipv4Addr>().ok().map(IpAddr::V4)
}

impl GeoVar {
    /// The address to look up (nginx's `ngx_http_geo_addr`).
    fn addr(&self, cx: &dyn VarCtx) -> Option<IpAddr> {
        let mut text = Vec::new();
        let found = cx.var(self.source.as_ref().unwrap_or(&Var::RemoteAddr), &mut text);
        if !found {
            return None;
        }
        let mut ip: IpAddr = std::str::from_utf8(&text).ok()?.parse().ok()?;
        if self.proxies.is_empty() {
            return Some(ip);
        }
        let mut xff = Vec::new();
        if !cx.var(&Var::Http("x-forwarded-for".into()), &mut xff) {
            return Some(ip);
        }
        // From the right: while the address we have is a proxy's, take
        // the element before it (only one step without proxy_recursive).
        let mut rest: &[u8] = &xff;
        loop {
            if !self.proxies.iter().any(|n| in_net(ip, n)) {
                break;
            }
            let trimmed = rest.trim_ascii_end();
            let trimmed = match trimmed.iter().rposition(|&c| c != b',' && c != b' ') {
                Some(e) => &trimmed[..=e],
                None => break,
            };
            let start = trimmed
                .iter()
                .rposition(|&c| c == b',' || c == b' ')
                .map_or(0, |p| p + 1);
            let Some(next) = std::str::from_utf8(&trimmed[start..])
                .ok()
                .and_then(parse_with_port)
            else {
                break;
            };
            ip = next;
            rest = &trimmed[..start];
            if !self.recursive || start == 0 {
                break;
            }
        }
        Some(ip)
    }
}

impl UserVar for GeoVar {
    fn eval(&self, cx: &dyn VarCtx, out: &mut Vec<u8>) -> bool {
        // What does not parse is looked up as 255.255.255.255 (INADDR_NONE).
        let (k, bits) = self.addr(cx).map(key).unwrap_or((u128::from(u32::MAX), 32));
        let v = match &self.table {
            Table::Cidr { v4, v6 } => {
                if bits == 32 {
                    v4.find(k, 32)
                } else {
                    v6.find(k, 128)
                }
            }
            Table::Ranges { blocks, default } => {
                let k = if bits == 32 { k as u32 } else { u32::MAX };
                let low = (k & 0xffff) as u16;
                blocks
                    .get(&((k >> 16) as u16))
                    .and_then(|p| p.iter().find(|p| p.start <= low && low <= p.end))
                    .map(|p| p.value)
                    .or(*default)
            }
        };
        if let Some(v) = v.and_then(|v| self.values.get(v)) {
            out.extend_from_slice(v);
        }
        true
    }
}

/// nginx's `ngx_ptocidr` for a `geo` network: the address and prefix
/// length, with nginx's warning when the address has bits past the mask.
fn parse_net(cx: &mut Compiler, e: &Directive, net: &str) -> ConfResult<(IpAddr, u8)> {
    let invalid = || ConfError::at(format!("invalid network \"{}\"", net), e);
    let (a, len) = match net.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (net, None),
    };
    let ip: IpAddr = a.parse().map_err(|_| invalid())?;
    let bits = if ip.is_ipv4() { 32 } else { 128 };
    let len = match len {
        Some(l) => l
            .parse::<u8>()
            .ok()
            .filter(|l| *l <= bits)
            .ok_or_else(invalid)?,
        None => bits,
    };
    let (k, kb) = match ip {
        IpAddr::V4(a) => (u128::from(u32::from(a)), 32),
        IpAddr::V6(a) => (u128::from(a), 128),
    };
    let masked = Prefixes::mask(k, len, kb);
    if masked != k {
        warn(
            cx,
            e,
            &format!("low address bits of {} are meaningless", net),
        );
    }
    let ip = match ip {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::from(masked as u32)),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::from(masked)),
    };
    Ok((ip, len))
}

fn warn(cx: &mut Compiler, e: &Directive, msg: &str) {
    cx.warnings
        .push(format!("{} in {}:{}", msg, e.file.display(), e.line));
}

/// nginx's `ngx_inet_addr`: dotted IPv4; 255.255.255.255 is its error
/// value, so it does not parse either.
fn inet_addr(s: &str) -> Option<u32> {
    let a: Ipv4Addr = s.parse().ok()?;
    let n = u32::from(a);
    (n != u32::MAX).then_some(n)
}

/// Builds the block's state while its entries are read.
struct Builder {
    values: Vec<Vec<u8>>,
    ranges: bool,
    /// Networks were added (then `ranges` may no longer come).
    cidr_used: bool,
    v4: Prefixes,
    v6: Prefixes,
    blocks: HashMap<u16, Vec<Piece>>,
    range_default: Option<usize>,
    proxies: Vec<(IpAddr, u8)>,
    recursive: bool,
}

impl Builder {
    fn value(&mut self, v: &str) -> usize {
        let b = v.as_bytes();
        match self.values.iter().position(|x| x == b) {
            Some(i) => i,
            None => {
                self.values.push(b.to_vec());
                self.values.len() - 1
            }
        }
    }

    fn add_net(
        &mut self,
        cx: &mut Compiler,
        e: &Directive,
        net: (IpAddr, u8),
        shown: &str,
        v: &str,
    ) {
        let val = self.value(v);
        let (k, bits) = match net.0 {
            IpAddr::V4(a) => (u128::from(u32::from(a)), 32),
            IpAddr::V6(a) => (u128::from(a), 128),
        };
        let t = if bits == 32 {
            &mut self.v4
        } else {
            &mut self.v6
        };
        if let Some(old) = t.insert(k, net.1, val) {
            let old = String::from_utf8_lossy(&self.values[old]).into_owned();
            warn(
                cx,
                e,
                &format!(
                    "duplicate network \"{}\", value: \"{}\", old value: \"{}\"",
                    shown, v, old
                ),
            );
        }
    }

    fn cidr_entry(&mut self, cx: &mut Compiler, e: &Directive) -> ConfResult<()> {
        self.cidr_used = true;
        let (k, v) = (e.name.as_str(), arg(e, 0));
        if k == "default" {
            self.add_net(cx, e, (IpAddr::V4(Ipv4Addr::from(0u32)), 0), k, v);
            self.add_net(cx, e, (IpAddr::V6(Ipv6Addr::from(0u128)), 0), k, v);
            return Ok(());
        }
        if k == "delete" {
            let (ip, len) = parse_net(cx, e, v)?;
            let gone = match ip {
                IpAddr::V4(a) => self.v4.remove(u128::from(u32::from(a)), len),
                IpAddr::V6(a) => self.v6.remove(u128::from(a), len),
            };
            if !gone {
                warn(cx, e, &format!("no network \"{}\" to delete", v));
            }
            return Ok(());
        }
        let net = parse_net(cx, e, k)?;
        self.add_net(cx, e, net, k, v);
        Ok(())
    }

    fn range_entry(&mut self, cx: &mut Compiler, e: &Directive) -> ConfResult<()> {
        let (k, v) = (e.name.as_str(), arg(e, 0));
        if k == "default" {
            if let Some(old) = self.range_default {
                let old = String::from_utf8_lossy(&self.values[old]).into_owned();
                warn(
                    cx,
                    e,
                    &format!(
                        "duplicate default geo range value: \"{}\", old value: \"{}\"",
                        v, old
                    ),
                );
            }
            self.range_default = Some(self.value(v));
            return Ok(());
        }
        let (net, del) = if k == "delete" { (v, true) } else { (k, false) };
        let invalid = || ConfError::at(format!("invalid range \"{}\"", net), e);
        let (a, b) = net.split_once('-').ok_or_else(invalid)?;
        let start = inet_addr(a).ok_or_else(invalid)?;
        let end = inet_addr(b).ok_or_else(invalid)?;
        if start > end {
            return Err(invalid());
        }
        if del {
            if self.delete_range(start, end) {
                warn(cx, e, &format!("no address range \"{}\" to delete", net));
            }
            return Ok(());
        }
        let val = self.value(v);
        self.add_range(cx, e, net, start, end, val)
    }

    /// Each 64K block the range touches, with the piece's bounds in it.
    fn blocks_of(start: u32, end: u32) -> Vec<(u16, u16, u16)> {
        let mut out = Vec::new();
        let mut n = start;
        loop {
            let h = (n >> 16) as u16;
            let s = if n == start { (n & 0xffff) as u16 } else { 0 };
            let e = if (n | 0xffff) > end {
                (end & 0xffff) as u16
            } else {
                0xffff
            };
            out.push((h, s, e));
            if h == 0xffff || (n | 0xffff) >= end {
                break;
            }
            n = (n | 0xffff) + 1;
        }
        out
    }

    fn add_range(
        &mut self,
        cx: &mut Compiler,
        e: &Directive,
        net: &str,
        start: u32,
        end: u32,
        val: usize,
    ) -> ConfResult<()> {
        for (h, s, en) in Self::blocks_of(start, end) {
            let pieces = self.blocks.entry(h).or_default();
            // nginx walks the block's pieces from the last.
            let mut i = pieces.len();
            let mut placed = false;
            while i > 0 {
                i -= 1;
                let p = pieces[i];
                if en < p.start {
                    continue;
                }
                if s > p.end {
                    pieces.insert(
                        i + 1,
                        Piece {
                            start: s,
                            end: en,
                            value: val,
                        },
                    );
                    placed = true;
                    break;
                }
                if s == p.start && en == p.end {
                    let old = String::from_utf8_lossy(&self.values[p.value]).into_owned();
                    let new = String::from_utf8_lossy(&self.values[val]).into_owned();
                    pieces[i].value = val;
                    warn(
                        cx,
                        e,
                        &format!(
                            "duplicate range \"{}\", value: \"{}\", old value: \"{}\"",
                            net, new, old
                        ),
                    );
                    placed = true;
                    break;
                }
                if s >= p.start && en <= p.end {
                    // Inside an older piece: split it around the new one.
                    let mut repl = Vec::new();
                    if s > p.start {
                        repl.push(Piece {
                            start: p.start,
                            end: s - 1,
                            value: p.value,
                        });
                    }
                    repl.push(Piece {
                        start: s,
                        end: en,
                        value: val,
                    });
                    if en < p.end {
                        repl.push(Piece {
                            start: en + 1,
                            end: p.end,
                            value: p.value,
                        });
                    }
                    pieces.splice(i..=i, repl);
                    placed = true;
                    break;
                }
                return Err(ConfError::at(
                    format!(
                        "range \"{}\" overlaps \"{}.{}.{}.{}-{}.{}.{}.{}\"",
                        net,
                        h >> 8,
                        h & 0xff,
                        p.start >> 8,
                        p.start & 0xff,
                        h >> 8,
                        h & 0xff,
                        p.end >> 8,
                        p.end & 0xff
                    ),
                    e,
                ));
            }
            if !placed {
                pieces.insert(
                    0,
                    Piece {
                        start: s,
                        end: en,
                        value: val,
                    },
                );
            }
        }
        Ok(())
    }

    /// True when some block had no such piece (nginx then warns).
    fn delete_range(&mut self, start: u32, end: u32) -> bool {
        let mut warn = false;
        for (h, s, e) in Self::blocks_of(start, end) {
            let pieces = self.blocks.entry(h).or_default();
            match pieces.iter().position(|p| p.start == s && p.end == e) {
                Some(i) => {
                    pieces.remove(i);
                }
                None => warn = true,
            }
        }
        warn
    }
}

fn set_geo(_hm: &mut HttpMain, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    compile_geo(d, cx)
}

/// Compiles a `geo` block (http's and stream's; stream has no
/// X-Forwarded-For, so its `proxy` entries find no header to follow).
pub(crate) fn compile_geo(d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let (source, name) = if d.args.len() == 2 {
        let s = var_name(d, arg(d, 0))?;
        (Some(cx.vars.resolve(s)), var_name(d, arg(d, 1))?)
    } else {
        (None, var_name(d, arg(d, 0))?)
    };
    let mut b = Builder {
        values: Vec::new(),
        ranges: false,
        cidr_used: false,
        v4: Prefixes::default(),
        v6: Prefixes::default(),
        blocks: HashMap::new(),
        range_default: None,
        proxies: Vec::new(),
        recursive: false,
    };
    for e in d.block.as_deref().unwrap_or(&[]) {
        no_block(e)?;
        if e.args.is_empty() {
            if e.name == "ranges" {
                if b.cidr_used {
                    return Err(ConfError::at(
                        "the \"ranges\" directive must be the first directive inside \"geo\" block",
                        e,
                    ));
                }
                b.ranges = true;
                continue;
            }
            if e.name == "proxy_recursive" {
                b.recursive = true;
                continue;
            }
        }
        if e.args.len() != 1 {
            return Err(ConfError::at("invalid number of the geo parameters", e));
        }
        if e.name == "proxy" {
            let net = parse_net(cx, e, arg(e, 0))?;
            b.proxies.push(net);
            continue;
        }
        if b.ranges {
            b.range_entry(cx, e)?;
        } else {
            b.cidr_entry(cx, e)?;
        }
    }
    let table = if b.ranges {
        Table::Ranges {
            blocks: b.blocks,
            default: b.range_default,
        }
    } else {
        Table::Cidr { v4: b.v4, v6: b.v6 }
    };
    let g = GeoVar {
        source,
        proxies: b.proxies,
        recursive: b.recursive,
        values: b.values,
        table,
    };
    define(cx, d, name, Arc::new(g))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_cut_at_64k() {
        assert_eq!(
            Builder::blocks_of(0x0102_0304, 0x0102_0310),
            vec![(0x0102, 0x0304, 0x0310)]
        );
        assert_eq!(
            Builder::blocks_of(0x0102_fff0, 0x0104_0001),
            vec![
                (0x0102, 0xfff0, 0xffff),
                (0x0103, 0, 0xffff),
                (0x0104, 0, 1)
            ]
        );
        assert_eq!(
            Builder::blocks_of(0xffff_0000, 0xffff_fffe),
            vec![(0xffff, 0, 0xfffe)]
        );
    }

    #[test]
    fn longest_prefix_wins() {
        let mut p = Prefixes::default();
        p.insert(0, 0, 0);
        p.insert(u128::from(0x0a00_0000u32), 8, 1);
        p.insert(u128::from(0x0a01_0000u32), 16, 2);
        assert_eq!(p.find(u128::from(0x0a01_0203u32), 32), Some(2));
        assert_eq!(p.find(u128::from(0x0a02_0203u32), 32), Some(1));
        assert_eq!(p.find(u128::from(0x0b02_0203u32), 32), Some(0));
    }

    #[test]
    fn forwarded_elements() {
        assert_eq!(parse_with_port("1.2.3.4"), "1.2.3.4".parse().ok());
        assert_eq!(parse_with_port("1.2.3.4:80"), "1.2.3.4".parse().ok());
        assert_eq!(parse_with_port("[::1]:80"), "::1".parse().ok());
        assert_eq!(parse_with_port("::1"), "::1".parse().ok());
        assert_eq!(parse_with_port("x"), None);
    }
}
