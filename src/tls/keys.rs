//! Private keys from PEM files, encrypted ones too (`ssl_password_file`).
//!
//! - Plain keys: PKCS#8, PKCS#1 (RSA) and SEC1 (EC), as rustls reads them.
//! - `ENCRYPTED PRIVATE KEY` (PKCS#8 with PBES2: PBKDF2 or scrypt, AES-CBC;
//!   what OpenSSL 3's `genrsa -aes256` and `pkey -aes256` write): decrypted
//!   by RustCrypto's `pkcs8`.
//! - The legacy OpenSSL encryption (`Proc-Type: 4,ENCRYPTED` and
//!   `DEK-Info:` headers, written by OpenSSL 1.x and `-traditional`):
//!   the key is `EVP_BytesToKey(MD5, password, IV[..8])`, the cipher
//!   AES-128/192/256-CBC or (3)DES-CBC; decrypted here with RustCrypto's
//!   block ciphers.
//!
//! Every password of the file is tried in turn, as nginx does. Runs on the
//! master thread while a configuration compiles.

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{PrivateKeyDer, PrivatePkcs1KeyDer, PrivatePkcs8KeyDer, PrivateSec1KeyDer};

use crate::config::{ConfError, ConfResult};
use crate::core::errno_text;

/// `ssl_password_file`: one password a line (CR or LF ends a line; empty
/// lines are skipped).
pub fn read_passwords(path: &str) -> ConfResult<Vec<Vec<u8>>> {
    let b = std::fs::read(path)
        .map_err(|e| ConfError::new(format!("open() \"{}\" failed {}", path, errno_text(&e))))?;
    let list: Vec<Vec<u8>> = b
        .split(|c| *c == b'\n' || *c == b'\r')
        .filter(|l| !l.is_empty())
        .map(<[u8]>::to_vec)
        .collect();
    if list.is_empty() {
        return Err(ConfError::new(format!("empty file \"{}\"", path)));
    }
    Ok(list)
}

/// One PEM block: its label, its headers and its decoded body.
struct Block {
    label: String,
    headers: Vec<(String, String)>,
    der: Vec<u8>,
}

/// The first PEM block whose label ends in `PRIVATE KEY`.
fn key_block(pem: &[u8]) -> Option<Block> {
    use base64::Engine;
    let text = std::str::from_utf8(pem).ok()?;
    let mut lines = text.lines();
    let label = loop {
        let l = lines.next()?.trim();
        if let Some(rest) = l.strip_prefix("-----BEGIN ") {
            let label = rest.strip_suffix("-----")?;
            if label.ends_with("PRIVATE KEY") {
                break label.to_string();
            }
        }
    };
    let mut headers = Vec::new();
    let mut b64 = String::new();
    for l in lines {
        let l = l.trim();
        if l.starts_with("-----END ") {
            break;
        }
        match l.split_once(':') {
            Some((k, v)) if b64.is_empty() => {
                headers.push((k.trim().to_string(), v.trim().to_string()))
            }
            _ => b64.push_str(l),
        }
    }
    let der = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
    Some(Block {
        label,
        headers,
        der,
    })
}

/// The key of a PEM file, decrypted with one of `passwords` if it is
/// encrypted. The error is the part of nginx's message after the file
/// name.
pub fn private_key(pem: &[u8], passwords: &[Vec<u8>]) -> Result<PrivateKeyDer<'static>, String> {
    let block = key_block(pem);
    let encrypted = block.as_ref().is_some_and(|b| {
        b.label == "ENCRYPTED PRIVATE KEY"
            || b.headers
                .iter()
                .any(|(k, v)| k == "Proc-Type" && v.ends_with("ENCRYPTED"))
    });
    let Some(block) = block.filter(|_| encrypted) else {
        return PrivateKeyDer::from_pem_slice(pem).map_err(|e| match e {
            rustls_pki_types::pem::Error::NoItemsFound => {
                "PEM_read_bio_PrivateKey() failed (no private key in the file)".to_string()
            }
            e => format!("PEM_read_bio_PrivateKey() failed ({})", e),
        });
    };
    if passwords.is_empty() {
        return Err("PEM_read_bio_PrivateKey() failed (the key is encrypted and no \"ssl_password_file\" is given)".into());
    }
    for p in passwords {
        let k = if block.label == "ENCRYPTED PRIVATE KEY" {
            pkcs8_decrypt(&block.der, p)
        } else {
            legacy_decrypt(&block, p)
        };
        if let Some(k) = k {
            return Ok(k);
        }
    }
    Err(
        "PEM_read_bio_PrivateKey() failed (bad decrypt: no password of the file decrypts the key)"
            .into(),
    )
}

fn pkcs8_decrypt(der: &[u8], password: &[u8]) -> Option<PrivateKeyDer<'static>> {
    let info = pkcs8::EncryptedPrivateKeyInfo::try_from(der).ok()?;
    let doc = info.decrypt(password).ok()?;
    // A wrong password can decrypt to garbage with valid padding.
    pkcs8::PrivateKeyInfo::try_from(doc.as_bytes()).ok()?;
    Some(PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
        doc.as_bytes().to_vec(),
    )))
}

/// OpenSSL's `EVP_BytesToKey` with MD5 and one iteration.
fn bytes_to_key(password: &[u8], salt: &[u8], len: usize) -> Vec<u8> {
    use md5::{Digest, Md5};
    let mut out = Vec::with_capacity(len + 16);
    let mut prev: Vec<u8> = Vec::new();
    while out.len() < len {
        let mut h = Md5::new();
        h.update(&prev);
        h.update(password);
        h.update(salt);
        prev = h.finalize().to_vec();
        out.extend_from_slice(&prev);
    }
    out.truncate(len);
    out
}

fn cbc_decrypt<C>(key: &[u8], iv: &[u8], data: &[u8]) -> Option<Vec<u8>>
where
    C: aes::cipher::BlockDecryptMut + aes::cipher::BlockCipher + aes::cipher::KeyInit,
{
    use aes::cipher::{block_padding::Pkcs7, BlockDecryptMut, KeyIvInit};
    cbc::Decryptor::<C>::new_from_slices(key, iv)
        .ok()?
        .decrypt_padded_vec_mut::<Pkcs7>(data)
        .ok()
}

fn legacy_decrypt(b: &Block, password: &[u8]) -> Option<PrivateKeyDer<'static>> {
    let dek = &b.headers.iter().find(|(k, _)| k == "DEK-Info")?.1;
    let (alg, iv_hex) = dek.split_once(',')?;
    let iv: Vec<u8> = (0..iv_hex.len() / 2)
        .map(|i| u8::from_str_radix(iv_hex.get(2 * i..2 * i + 2)?, 16).ok())
        .collect::<Option<_>>()?;
    let salt = iv.get(..8)?;
    let plain = match alg.trim() {
        "AES-128-CBC" => cbc_decrypt::<aes::Aes128>(&bytes_to_key(password, salt, 16), &iv, &b.der),
        "AES-192-CBC" => cbc_decrypt::<aes::Aes192>(&bytes_to_key(password, salt, 24), &iv, &b.der),
        "AES-256-CBC" => cbc_decrypt::<aes::Aes256>(&bytes_to_key(password, salt, 32), &iv, &b.der),
        "DES-EDE3-CBC" => {
            cbc_decrypt::<des::TdesEde3>(&bytes_to_key(password, salt, 24), &iv, &b.der)
        }
        "DES-CBC" => cbc_decrypt::<des::Des>(&bytes_to_key(password, salt, 8), &iv, &b.der),
        _ => None,
    }?;
    // A wrong password can leave valid padding: the result must parse.
    match b.label.as_str() {
        "RSA PRIVATE KEY" => {
            let k = PrivateKeyDer::Pkcs1(PrivatePkcs1KeyDer::from(plain));
            crate::tls::provider::sign::any_supported_type(&k).ok()?;
            Some(k)
        }
        "EC PRIVATE KEY" => {
            let k = PrivateKeyDer::Sec1(PrivateSec1KeyDer::from(plain));
            crate::tls::provider::sign::any_supported_type(&k).ok()?;
            Some(k)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evp_bytes_to_key() {
        // `openssl enc -aes-128-cbc -k secret -S 0102030405060708 -P -md md5`
        // prints key=C9E5A1BD216DBE1317E230CEF48F38EE and
        // iv=7F0E17AD64022144BCCEC4A1AA2879AB: the first 32 bytes.
        let k = bytes_to_key(b"secret", &[1, 2, 3, 4, 5, 6, 7, 8], 32);
        let hex: String = k.iter().map(|b| format!("{:02X}", b)).collect();
        assert_eq!(
            hex,
            "C9E5A1BD216DBE1317E230CEF48F38EE7F0E17AD64022144BCCEC4A1AA2879AB"
        );
    }

    #[test]
    fn encrypted_keys() {
        let dir = std::env::temp_dir().join(format!("tern-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let run = |args: &[&str]| {
            std::process::Command::new("openssl")
                .args(args)
                .current_dir(&dir)
                .output()
                .map(|o| o.status.success())
                .unwrap_or(false)
        };
        // Needs the openssl CLI (as nginx-tests do); without it, nothing
        // to compare with.
        if !run(&["version"]) {
            return;
        }
        assert!(run(&[
            "genrsa", "-aes128", "-passout", "pass:pw", "-out", "p8.key", "2048"
        ]));
        assert!(run(&[
            "genrsa",
            "-traditional",
            "-aes256",
            "-passout",
            "pass:pw",
            "-out",
            "trad.key",
            "2048"
        ]));
        assert!(run(&[
            "ecparam",
            "-name",
            "prime256v1",
            "-genkey",
            "-noout",
            "-out",
            "ec.key"
        ]));
        assert!(run(&[
            "ec", "-in", "ec.key", "-des3", "-passout", "pass:pw", "-out", "ec3.key"
        ]));
        for f in ["p8.key", "trad.key", "ec3.key"] {
            let pem = std::fs::read(dir.join(f)).unwrap();
            let pw = vec![b"wrong".to_vec(), b"pw".to_vec()];
            let k = private_key(&pem, &pw).unwrap_or_else(|e| panic!("{}: {}", f, e));
            assert!(
                crate::tls::provider::sign::any_supported_type(&k).is_ok(),
                "{}",
                f
            );
            assert!(private_key(&pem, &[b"wrong".to_vec()]).is_err(), "{}", f);
            assert!(private_key(&pem, &[]).is_err(), "{}", f);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
