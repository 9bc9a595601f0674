//! A client certificate as nginx's `$ssl_client_*` variables show it:
//! distinguished names in RFC 2253 form (OpenSSL's `XN_FLAG_RFC2253`) and
//! the legacy `/C=../CN=..` form (`X509_NAME_oneline`), the serial as
//! `i2a_ASN1_INTEGER` prints it, times as `ASN1_TIME_print`, the PEM in
//! nginx's three spellings. Computed on demand from the DER kept in
//! `TlsInfo` (a request that uses no such variable pays nothing).

use x509_parser::asn1_rs::{Tag, ToDer};
use x509_parser::prelude::*;

const HEX_UPPER: &[u8; 16] = b"0123456789ABCDEF";
const HEX_LOWER: &[u8; 16] = b"0123456789abcdef";

/// OpenSSL's short names of the attribute types seen in names.
fn short_name(oid: &str) -> Option<&'static str> {
    Some(match oid {
        "2.5.4.3" => "CN",
        "2.5.4.4" => "SN",
        "2.5.4.5" => "serialNumber",
        "2.5.4.6" => "C",
        "2.5.4.7" => "L",
        "2.5.4.8" => "ST",
        "2.5.4.9" => "street",
        "2.5.4.10" => "O",
        "2.5.4.11" => "OU",
        "2.5.4.12" => "title",
        "2.5.4.13" => "description",
        "2.5.4.15" => "businessCategory",
        "2.5.4.17" => "postalCode",
        "2.5.4.41" => "name",
        "2.5.4.42" => "GN",
        "2.5.4.43" => "initials",
        "2.5.4.44" => "generationQualifier",
        "2.5.4.46" => "dnQualifier",
        "2.5.4.65" => "pseudonym",
        "2.5.4.97" => "organizationIdentifier",
        "1.2.840.113549.1.9.1" => "emailAddress",
        "0.9.2342.19200300.100.1.1" => "UID",
        "0.9.2342.19200300.100.1.25" => "DC",
        "1.3.6.1.4.1.311.60.2.1.1" => "jurisdictionL",
        "1.3.6.1.4.1.311.60.2.1.2" => "jurisdictionST",
        "1.3.6.1.4.1.311.60.2.1.3" => "jurisdictionC",
        _ => return None,
    })
}

/// An attribute value as UTF-8 bytes (BMP and universal strings
/// converted); None for a type that is not a string.
fn value_bytes(a: &AttributeTypeAndValue<'_>) -> Option<Vec<u8>> {
    let v = a.attr_value();
    let data = v.data;
    match v.tag() {
        Tag::Utf8String
        | Tag::PrintableString
        | Tag::Ia5String
        | Tag::NumericString
        | Tag::T61String
        | Tag::VisibleString => Some(data.to_vec()),
        Tag::BmpString => {
            let u: Vec<u16> = data
                .chunks_exact(2)
                .map(|c| u16::from_be_bytes([c[0], c[1]]))
                .collect();
            Some(String::from_utf16_lossy(&u).into_bytes())
        }
        Tag::UniversalString => Some(
            data.chunks_exact(4)
                .filter_map(|c| char::from_u32(u32::from_be_bytes([c[0], c[1], c[2], c[3]])))
                .collect::<String>()
                .into_bytes(),
        ),
        _ => None,
    }
}

/// `X509_NAME_print_ex(.., XN_FLAG_RFC2253)`: RDNs last to first, `,`
/// between them and `+` inside one, RFC 2253's specials escaped with a
/// backslash, control and non-ASCII bytes as `\XX`, values of unknown
/// types as `#` and their DER in hex.
pub fn dn_rfc2253(name: &X509Name<'_>, out: &mut Vec<u8>) {
    let rdns: Vec<_> = name.iter_rdn().collect();
    for (i, rdn) in rdns.iter().rev().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        for (j, a) in rdn.iter().enumerate() {
            if j > 0 {
                out.push(b'+');
            }
            let oid = a.attr_type().to_id_string();
            match short_name(&oid) {
                Some(n) => out.extend_from_slice(n.as_bytes()),
                None => out.extend_from_slice(oid.as_bytes()),
            }
            out.push(b'=');
            let known = short_name(&oid).is_some();
            match value_bytes(a).filter(|_| known) {
                Some(v) => escape_2253(&v, out),
                None => {
                    // DUMP_UNKNOWN_FIELDS: the whole DER of the value.
                    out.push(b'#');
                    let der = a.attr_value().to_der_vec().unwrap_or_default();
                    hex(&der, HEX_UPPER, out);
                }
            }
        }
    }
}

fn escape_2253(v: &[u8], out: &mut Vec<u8>) {
    let last = v.len().saturating_sub(1);
    for (i, &c) in v.iter().enumerate() {
        match c {
            b',' | b'+' | b'"' | b'\\' | b'<' | b'>' | b';' => {
                out.push(b'\\');
                out.push(c);
            }
            b'#' if i == 0 => out.extend_from_slice(b"\\#"),
            b' ' if i == 0 || i == last => out.extend_from_slice(b"\\ "),
            0..=0x1f | 0x7f..=0xff => {
                out.extend_from_slice(&[
                    b'\\',
                    HEX_UPPER[(c >> 4) as usize],
                    HEX_UPPER[(c & 15) as usize],
                ]);
            }
            _ => out.push(c),
        }
    }
}

/// `X509_NAME_oneline`: `/type=value` in order, bytes outside
/// printable ASCII as `\xXX`.
pub fn dn_legacy(name: &X509Name<'_>, out: &mut Vec<u8>) {
    for a in name.iter_attributes() {
        out.push(b'/');
        let oid = a.attr_type().to_id_string();
        match short_name(&oid) {
            Some(n) => out.extend_from_slice(n.as_bytes()),
            None => out.extend_from_slice(oid.as_bytes()),
        }
        out.push(b'=');
        let v = value_bytes(a).unwrap_or_else(|| a.attr_value().data.to_vec());
        for c in v {
            if (b' '..=b'~').contains(&c) {
                out.push(c);
            } else {
                out.extend_from_slice(b"\\x");
                out.push(HEX_UPPER[(c >> 4) as usize]);
                out.push(HEX_UPPER[(c & 15) as usize]);
            }
        }
    }
}

fn hex(b: &[u8], digits: &[u8; 16], out: &mut Vec<u8>) {
    for &c in b {
        out.push(digits[(c >> 4) as usize]);
        out.push(digits[(c & 15) as usize]);
    }
}

/// Lowercase hex (nginx's `ngx_hex_dump`).
pub fn hex_lower(b: &[u8], out: &mut Vec<u8>) {
    hex(b, HEX_LOWER, out)
}

/// `i2a_ASN1_INTEGER`: the magnitude in uppercase hex pairs.
pub fn serial(c: &X509Certificate<'_>, out: &mut Vec<u8>) {
    let s = c.raw_serial();
    let skip = s
        .iter()
        .take_while(|b| **b == 0)
        .count()
        .min(s.len().saturating_sub(1));
    if s.is_empty() {
        out.extend_from_slice(b"00");
    }
    hex(&s[skip..], HEX_UPPER, out);
}

/// `ASN1_TIME_print`: `Nov  7 12:00:00 2026 GMT`.
pub fn time(t: i64, out: &mut Vec<u8>) {
    const MON: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let days = t.div_euclid(86400);
    let secs = t.rem_euclid(86400);
    let (y, m, d) = crate::http::date::civil_from_days(days);
    let s = format!(
        "{} {:2} {:02}:{:02}:{:02} {} GMT",
        MON[(m as usize).saturating_sub(1) % 12],
        d,
        secs / 3600,
        secs / 60 % 60,
        secs % 60,
        y
    );
    out.extend_from_slice(s.as_bytes());
}

/// PEM of a DER certificate, 64 columns, trailing newline
/// (`PEM_write_bio_X509`).
pub fn pem(der: &[u8]) -> Vec<u8> {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = Vec::with_capacity(b64.len() + b64.len() / 64 + 60);
    out.extend_from_slice(b"-----BEGIN CERTIFICATE-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.extend_from_slice(line);
        out.push(b'\n');
    }
    out.extend_from_slice(b"-----END CERTIFICATE-----\n");
    out
}

/// `$ssl_client_cert`: the PEM with a tab after every newline but the
/// last, which is dropped (a value that folds as a header line).
pub fn pem_tabbed(der: &[u8], out: &mut Vec<u8>) {
    let p = pem(der);
    let body = p.strip_suffix(b"\n").unwrap_or(&p);
    for &c in body {
        out.push(c);
        if c == b'\n' {
            out.push(b'\t');
        }
    }
}

/// `$ssl_client_escaped_cert`: the PEM escaped as a URI component.
pub fn pem_escaped(der: &[u8], out: &mut Vec<u8>) {
    for c in pem(der) {
        if c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~') {
            out.push(c);
        } else {
            out.extend_from_slice(&[
                b'%',
                HEX_UPPER[(c >> 4) as usize],
                HEX_UPPER[(c & 15) as usize],
            ]);
        }
    }
}

/// SHA-1 of the DER, lowercase hex (`$ssl_client_fingerprint`).
pub fn fingerprint(der: &[u8], out: &mut Vec<u8>) {
    let d = ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, der);
    hex_lower(d.as_ref(), out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        // rcgen orders the attributes its own way (CN, C, O here).
        p.distinguished_name
            .push(rcgen::DnType::CountryName, "RU".to_string());
        p.distinguished_name
            .push(rcgen::DnType::OrganizationName, "A, \"B\"".to_string());
        p.distinguished_name
            .push(rcgen::DnType::CommonName, " caf\u{e9}".to_string());
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = p.self_signed(&key).unwrap();
        let (_, c) = X509Certificate::from_der(cert.der()).unwrap();
        let mut out = Vec::new();
        dn_rfc2253(c.subject(), &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "O=A\\, \\\"B\\\",C=RU,CN=\\ caf\\C3\\A9"
        );
        let mut out = Vec::new();
        dn_legacy(c.subject(), &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "/CN= caf\\xC3\\xA9/C=RU/O=A, \"B\""
        );
        let mut out = Vec::new();
        time(0, &mut out);
        assert_eq!(out, b"Jan  1 00:00:00 1970 GMT");
    }
}

/// The certificates of a PEM file, `TRUSTED CERTIFICATE` blocks included
/// (what `openssl x509 -trustout` writes: the certificate followed by
/// OpenSSL's trust settings, which are dropped; OpenSSL's `_AUX` readers
/// take them, and nginx uses those for certificates and CA files).
pub fn pem_certs(
    pem: &[u8],
) -> Result<Vec<rustls_pki_types::CertificateDer<'static>>, rustls_pki_types::pem::Error> {
    use rustls_pki_types::pem::PemObject;
    const TRUSTED: &[u8] = b"TRUSTED CERTIFICATE-----";
    let text: std::borrow::Cow<[u8]> = if pem.windows(TRUSTED.len()).any(|w| w == TRUSTED) {
        let s = String::from_utf8_lossy(pem)
            .replace(
                "-----BEGIN TRUSTED CERTIFICATE-----",
                "-----BEGIN CERTIFICATE-----",
            )
            .replace(
                "-----END TRUSTED CERTIFICATE-----",
                "-----END CERTIFICATE-----",
            );
        std::borrow::Cow::Owned(s.into_bytes())
    } else {
        std::borrow::Cow::Borrowed(pem)
    };
    rustls_pki_types::CertificateDer::pem_slice_iter(&text)
        .map(|r| {
            r.map(|c| match der_len(&c) {
                Some(n) if n < c.len() => c[..n].to_vec().into(),
                _ => c,
            })
        })
        .collect()
}

/// The length of the DER element at the start of `b` (its tag, length
/// and contents).
fn der_len(b: &[u8]) -> Option<usize> {
    let first = *b.get(1)?;
    if first < 0x80 {
        return Some(2 + first as usize);
    }
    let n = (first & 0x7f) as usize;
    if n == 0 || n > 4 {
        return None;
    }
    let mut len = 0usize;
    for i in 0..n {
        len = len << 8 | *b.get(2 + i)? as usize;
    }
    Some(2 + n + len)
}

#[cfg(test)]
mod pem_tests {
    #[test]
    fn trusted_certificate_blocks() {
        // A DER SEQUENCE of 3 bytes, then 2 bytes of "trust settings".
        let body = [0x30u8, 0x03, 1, 2, 3, 0x30, 0x00];
        let pem = "-----BEGIN TRUSTED CERTIFICATE-----\nMAMBAgMwAA==\n-----END TRUSTED CERTIFICATE-----\n";
        let certs = super::pem_certs(pem.as_bytes()).unwrap();
        assert_eq!(certs.len(), 1);
        assert_eq!(certs[0].as_ref(), &body[..5]);
    }
}
