//! What `tern -V` reports: nginx's module list in `configure arguments:`
//! form, from one table, so tools that read `-V` know what to expect.

/// (nginx configure name, built by nginx by default, implemented by tern).
const MODULES: &[(&str, bool, bool)] = &[
    ("threads", false, true),
    ("file-aio", false, true),
    ("http_stub_status_module", false, true),
    ("http_ssl_module", false, true),
    ("http_v2_module", false, true),
    ("http_v3_module", false, true),
    ("http_gzip_static_module", false, true),
    ("http_gunzip_module", false, true),
    ("http_realip_module", false, true),
    ("http_sub_module", false, true),
    ("http_secure_link_module", false, true),
    ("http_random_index_module", false, true),
    ("http_dav_module", false, true),
    ("http_flv_module", false, true),
    ("http_mp4_module", false, true),
    ("http_addition_module", false, true),
    ("http_auth_request_module", false, true),
    ("http_slice_module", false, true),
    ("stream", false, true),
    ("http_charset_module", true, true),
    ("http_gzip_module", true, true),
    ("http_ssi_module", true, true),
    ("http_userid_module", true, true),
    ("http_access_module", true, true),
    ("http_auth_basic_module", true, true),
    ("http_mirror_module", true, true),
    ("http_autoindex_module", true, true),
    ("http_geo_module", true, true),
    ("http_map_module", true, true),
    ("http_split_clients_module", true, true),
    ("http_referer_module", true, true),
    ("http_rewrite_module", true, true),
    ("http_proxy_module", true, true),
    ("http_fastcgi_module", true, true),
    ("http_uwsgi_module", true, true),
    ("http_scgi_module", true, true),
    ("http_grpc_module", true, true),
    ("http_memcached_module", true, true),
    ("http_limit_conn_module", true, true),
    ("http_limit_req_module", true, true),
    ("http_empty_gif_module", true, true),
    ("http_browser_module", true, false),
    ("http_upstream_hash_module", true, true),
    ("http_upstream_ip_hash_module", true, true),
    ("http_upstream_least_conn_module", true, true),
    ("http_upstream_random_module", true, true),
    ("http_upstream_keepalive_module", true, true),
    ("http_upstream_zone_module", true, true),
    ("http-cache", true, true),
    // The stream modules nginx builds with `--with-stream`.
    ("stream_limit_conn_module", true, true),
    ("stream_access_module", true, true),
    ("stream_geo_module", true, true),
    ("stream_map_module", true, true),
    ("stream_split_clients_module", true, true),
    ("stream_return_module", true, true),
    ("stream_set_module", true, true),
    ("stream_upstream_hash_module", true, true),
    ("stream_upstream_least_conn_module", true, true),
    ("stream_upstream_random_module", true, true),
    ("stream_upstream_zone_module", true, true),
    ("stream_realip_module", false, true),
    ("stream_ssl_module", false, true),
    ("stream_ssl_preread_module", false, true),
    // `mail {}`: pop3, imap and smtp are built with it by default.
    ("mail", false, true),
    ("mail_ssl_module", false, true),
];

/// The `configure arguments:` line.
pub fn configure_arguments(prefix: &str) -> String {
    let mut s = format!("--prefix={}", prefix);
    for (name, default, have) in MODULES {
        match (default, have) {
            (false, true) => s.push_str(&format!(" --with-{}", name)),
            (true, false) => s.push_str(&format!(" --without-{}", name)),
            _ => {}
        }
    }
    s
}
