//! Status-line reason phrases and the built-in error pages, byte-for-byte in
//! nginx's shape (with "tern" where nginx says "nginx").
//!
//! Two tables, because nginx has two: the reason phrase on the status line
//! (`ngx_http_header_filter_module.c`) and the title of the HTML error page
//! (`ngx_http_special_response.c`) differ for a few codes, e.g. 302 is
//! "Moved Temporarily" on the status line but "Found" in the page, and 401
//! is "Unauthorized" vs "Authorization Required". Clients and tests compare
//! both, so both are kept verbatim.
//!
//! nginx's internal codes 494-497 are sent with status line 400 (see
//! [`wire_code`]) but keep their own page text.

/// Status code actually put on the wire: nginx's internal 494 (request
/// header too large), 495 (certificate error), 496 (no certificate) and 497
/// (plain HTTP to HTTPS port) go out as 400. Everything else is unchanged.
pub fn wire_code(code: u16) -> u16 {
    match code {
        494..=497 => 400,
        c => c,
    }
}

/// Reason phrase nginx sends for the code, e.g. 200 -> "OK", 413 -> "Request
/// Entity Too Large". 494-497 are nginx-internal and answer with the 400
/// phrase (send them with [`wire_code`]). `None` for codes nginx has no
/// phrase for (including 100, 101, 203, 205, 300, 305, 407, 417-420,
/// 422-428, 506); nginx then sends just the code and a space.
pub fn reason(code: u16) -> Option<&'static str> {
    Some(match code {
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        204 => "No Content",
        206 => "Partial Content",

        301 => "Moved Permanently",
        302 => "Moved Temporarily",
        303 => "See Other",
        304 => "Not Modified",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",

        400 | 494..=497 => "Bad Request",
        401 => "Unauthorized",
        402 => "Payment Required",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Not Allowed",
        406 => "Not Acceptable",
        408 => "Request Time-out",
        409 => "Conflict",
        410 => "Gone",
        411 => "Length Required",
        412 => "Precondition Failed",
        413 => "Request Entity Too Large",
        414 => "Request-URI Too Large",
        415 => "Unsupported Media Type",
        416 => "Requested Range Not Satisfiable",
        421 => "Misdirected Request",
        429 => "Too Many Requests",

        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Temporarily Unavailable",
        504 => "Gateway Time-out",
        505 => "HTTP Version Not Supported",
        507 => "Insufficient Storage",
        _ => return None,
    })
}

/// Append the status line for `code` as nginx writes it:
/// `HTTP/1.1 404 Not Found\r\n`, or `HTTP/1.1 599 \r\n` for a code without a
/// phrase. 494-497 are written as 400.
pub fn status_line(code: u16, out: &mut Vec<u8>) {
    let code = wire_code(code);
    out.extend_from_slice(b"HTTP/1.1 ");
    // "%03ui": at least three digits, zero padded; a wider value (only
    // possible from a misconfigured `return 1000`) is written in full.
    let digits = [
        (code / 10_000 % 10) as u8,
        (code / 1000 % 10) as u8,
        (code / 100 % 10) as u8,
        (code / 10 % 10) as u8,
        (code % 10) as u8,
    ];
    let skip = match code {
        10_000.. => 0,
        1000.. => 1,
        _ => 2,
    };
    out.extend(digits[skip..].iter().map(|d| b'0' + d));
    out.push(b' ');
    if let Some(r) = reason(code) {
        out.extend_from_slice(r.as_bytes());
    }
    out.extend_from_slice(b"\r\n");
}

/// How the page for a code is built: the `<title>` text, the `<h1>` text and
/// an optional extra `<center>` line (only nginx's internal codes have one).
struct Page {
    title: &'static str,
    h1: &'static str,
    detail: Option<&'static str>,
}

fn page(code: u16) -> Option<Page> {
    let plain = |t: &'static str| Page {
        title: t,
        h1: t,
        detail: None,
    };
    let internal = |title: &'static str, detail: &'static str| Page {
        title,
        h1: "400 Bad Request",
        detail: Some(detail),
    };
    Some(match code {
        301 => plain("301 Moved Permanently"),
        302 => plain("302 Found"),
        303 => plain("303 See Other"),
        307 => plain("307 Temporary Redirect"),
        308 => plain("308 Permanent Redirect"),

        400 => plain("400 Bad Request"),
        401 => plain("401 Authorization Required"),
        402 => plain("402 Payment Required"),
        403 => plain("403 Forbidden"),
        // 498 ("canceled") reuses the 404 page in nginx.
        404 | 498 => plain("404 Not Found"),
        405 => plain("405 Not Allowed"),
        406 => plain("406 Not Acceptable"),
        408 => plain("408 Request Time-out"),
        409 => plain("409 Conflict"),
        410 => plain("410 Gone"),
        411 => plain("411 Length Required"),
        412 => plain("412 Precondition Failed"),
        413 => plain("413 Request Entity Too Large"),
        414 => plain("414 Request-URI Too Large"),
        415 => plain("415 Unsupported Media Type"),
        416 => plain("416 Requested Range Not Satisfiable"),
        421 => plain("421 Misdirected Request"),
        429 => plain("429 Too Many Requests"),

        494 => internal(
            "400 Request Header Or Cookie Too Large",
            "Request Header Or Cookie Too Large",
        ),
        495 => internal("400 The SSL certificate error", "The SSL certificate error"),
        496 => internal(
            "400 No required SSL certificate was sent",
            "No required SSL certificate was sent",
        ),
        497 => internal(
            "400 The plain HTTP request was sent to HTTPS port",
            "The plain HTTP request was sent to HTTPS port",
        ),

        500 => plain("500 Internal Server Error"),
        501 => plain("501 Not Implemented"),
        502 => plain("502 Bad Gateway"),
        503 => plain("503 Service Temporarily Unavailable"),
        504 => plain("504 Gateway Time-out"),
        505 => plain("505 HTTP Version Not Supported"),
        507 => plain("507 Insufficient Storage"),
        _ => return None,
    })
}

/// The HTML body nginx sends for an error/redirect status, appended to
/// `out`. The tail names the server as "tern", or "tern/VERSION" with
/// `server_tokens on`. MSIE padding is added by
/// [`crate::http::response::special_response_to`]. Returns
/// false (and appends nothing) if there is no built-in page for the code;
/// nginx then sends an empty body.
pub fn error_page(code: u16, server_tokens: bool, version: &str, out: &mut Vec<u8>) -> bool {
    let Some(p) = page(code) else {
        return false;
    };
    // The page is ~150 bytes plus its titles: one allocation, not growth
    // piece by piece.
    out.reserve(160 + p.title.len() + p.h1.len() + p.detail.map_or(0, str::len));
    out.extend_from_slice(b"<html>\r\n<head><title>");
    out.extend_from_slice(p.title.as_bytes());
    out.extend_from_slice(b"</title></head>\r\n<body>\r\n<center><h1>");
    out.extend_from_slice(p.h1.as_bytes());
    out.extend_from_slice(b"</h1></center>\r\n");
    if let Some(d) = p.detail {
        out.extend_from_slice(b"<center>");
        out.extend_from_slice(d.as_bytes());
        out.extend_from_slice(b"</center>\r\n");
    }
    out.extend_from_slice(b"<hr><center>tern");
    if server_tokens {
        out.push(b'/');
        out.extend_from_slice(version.as_bytes());
    }
    out.extend_from_slice(b"</center>\r\n</body>\r\n</html>\r\n");
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page_str(code: u16, tokens: bool) -> Option<String> {
        let mut v = Vec::new();
        if error_page(code, tokens, "0.1.0", &mut v) {
            Some(String::from_utf8(v).unwrap())
        } else {
            assert!(v.is_empty());
            None
        }
    }

    #[test]
    fn reasons() {
        assert_eq!(reason(200), Some("OK"));
        assert_eq!(reason(302), Some("Moved Temporarily"));
        assert_eq!(reason(401), Some("Unauthorized"));
        assert_eq!(reason(413), Some("Request Entity Too Large"));
        assert_eq!(reason(494), Some("Bad Request"));
        assert_eq!(reason(497), Some("Bad Request"));
        for none in [
            0,
            100,
            101,
            199,
            203,
            205,
            207,
            300,
            305,
            306,
            309,
            407,
            417,
            418,
            422,
            426,
            428,
            430,
            444,
            498,
            499,
            506,
            508,
            599,
            999,
            1000,
            u16::MAX,
        ] {
            assert_eq!(reason(none), None, "{none}");
        }
    }

    #[test]
    fn wire_codes() {
        assert_eq!(wire_code(494), 400);
        assert_eq!(wire_code(495), 400);
        assert_eq!(wire_code(496), 400);
        assert_eq!(wire_code(497), 400);
        assert_eq!(wire_code(498), 498);
        assert_eq!(wire_code(404), 404);
    }

    #[test]
    fn status_lines() {
        let line = |c| {
            let mut v = Vec::new();
            status_line(c, &mut v);
            String::from_utf8(v).unwrap()
        };
        assert_eq!(line(200), "HTTP/1.1 200 OK\r\n");
        assert_eq!(line(302), "HTTP/1.1 302 Moved Temporarily\r\n");
        assert_eq!(line(494), "HTTP/1.1 400 Bad Request\r\n");
        assert_eq!(line(299), "HTTP/1.1 299 \r\n");
        assert_eq!(line(101), "HTTP/1.1 101 \r\n");
        assert_eq!(line(5), "HTTP/1.1 005 \r\n");
        assert_eq!(line(1000), "HTTP/1.1 1000 \r\n");
        assert_eq!(line(u16::MAX), "HTTP/1.1 65535 \r\n");
    }

    #[test]
    fn page_404_exact() {
        assert_eq!(
            page_str(404, false).unwrap(),
            "<html>\r\n<head><title>404 Not Found</title></head>\r\n<body>\r\n\
             <center><h1>404 Not Found</h1></center>\r\n\
             <hr><center>tern</center>\r\n</body>\r\n</html>\r\n"
        );
        assert_eq!(
            page_str(404, true).unwrap(),
            "<html>\r\n<head><title>404 Not Found</title></head>\r\n<body>\r\n\
             <center><h1>404 Not Found</h1></center>\r\n\
             <hr><center>tern/0.1.0</center>\r\n</body>\r\n</html>\r\n"
        );
    }

    #[test]
    fn page_internal_codes_exact() {
        assert_eq!(
            page_str(494, false).unwrap(),
            "<html>\r\n<head><title>400 Request Header Or Cookie Too Large</title></head>\r\n\
             <body>\r\n<center><h1>400 Bad Request</h1></center>\r\n\
             <center>Request Header Or Cookie Too Large</center>\r\n\
             <hr><center>tern</center>\r\n</body>\r\n</html>\r\n"
        );
        assert!(page_str(495, false)
            .unwrap()
            .contains("<title>400 The SSL certificate error</title>"));
        assert!(page_str(496, false)
            .unwrap()
            .contains("<center>No required SSL certificate was sent</center>\r\n"));
        assert!(page_str(497, false).unwrap().contains(
            "<title>400 The plain HTTP request was sent to HTTPS port</title></head>\r\n\
             <body>\r\n<center><h1>400 Bad Request</h1></center>\r\n\
             <center>The plain HTTP request was sent to HTTPS port</center>\r\n"
        ));
        assert_eq!(page_str(498, false), page_str(404, false));
    }

    #[test]
    fn page_titles_differ_from_reasons() {
        assert!(page_str(302, false).unwrap().contains("<h1>302 Found</h1>"));
        assert!(page_str(401, false)
            .unwrap()
            .contains("<title>401 Authorization Required</title>"));
    }

    #[test]
    fn every_listed_code_has_a_page() {
        for code in [
            301, 302, 303, 307, 308, 400, 401, 402, 403, 404, 405, 406, 408, 409, 410, 411, 412,
            413, 414, 415, 416, 421, 429, 494, 495, 496, 497, 500, 501, 502, 503, 504, 505, 507,
        ] {
            let p = page_str(code, false).unwrap_or_else(|| panic!("{code}"));
            // Title starts with the code (or 400 for internal codes), and
            // for ordinary codes it agrees with the h1.
            let shown = wire_code(code);
            assert!(p.contains(&format!("<title>{shown} ")), "{code}");
            assert!(p.contains(&format!("<h1>{shown} ")), "{code}");
            assert!(p.ends_with("<hr><center>tern</center>\r\n</body>\r\n</html>\r\n"));
        }
    }

    #[test]
    fn no_page_codes() {
        for code in [
            0, 100, 200, 201, 204, 300, 304, 305, 306, 407, 417, 418, 422, 444, 499, 506, 508, 999,
        ] {
            assert_eq!(page_str(code, true), None, "{code}");
        }
    }
}
