//! Tests of the web configuration format.

use super::*;
use std::time::Duration;

const HASH: &str = "$2y$10$X0h1gDsPszWURQaxFh.zoubFi6DXncSjhoQNJgRrnGs7EsimhC7zG";

fn err(text: &str) -> String {
    parse(text, "web.yml").unwrap_err().to_string()
}

#[test]
fn empty_and_comment_only_files_mean_plain_http() {
    assert_eq!(
        parse("", "w").unwrap(),
        WebConfig {
            http2: true,
            ..Default::default()
        }
    );
    assert_eq!(parse("# nothing\n---\n", "w").unwrap().tls, None);
}

#[test]
fn the_helm_chart_file_parses() {
    // As rendered by dcgm-exporter's deployment/templates/web-config-configmap.yaml with
    // TLS, a client CA and one basic-auth user (Helm's htpasswd emits $2a$).
    let text = format!(
        "tls_server_config:\n   cert_file: \"/etc/dcgm-exporter/tls/tls.crt\"\n   key_file: \"/etc/dcgm-exporter/tls/tls.key\"\n   client_auth_type: RequireAndVerifyClientCert\n   client_ca_file: \"/etc/dcgm-exporter/tls/ca.crt\"\nbasic_auth_users:\n  alice: {}\n",
        HASH.replacen("$2y$", "$2a$", 1)
    );
    let c = parse(&text, "web-config.yaml").unwrap();
    let tls = c.tls.unwrap();
    assert_eq!(tls.cert, Pem::File("/etc/dcgm-exporter/tls/tls.crt".into()));
    assert_eq!(tls.client_auth, ClientAuth::RequireAndVerifyClientCert);
    assert_eq!(
        tls.client_ca,
        Some(Pem::File("/etc/dcgm-exporter/tls/ca.crt".into()))
    );
    assert_eq!(
        (tls.min_version, tls.max_version),
        (TlsVersion::Tls12, TlsVersion::Tls13)
    );
    assert!(tls.prefer_server_cipher_suites);
    assert_eq!(c.basic_auth_users.len(), 1);
}

#[test]
fn unknown_keys_are_named_with_file_and_line() {
    let e = err("tls_server_config:\n  cert_file: a\n  key_file: b\n  cert_fil: c\n");
    assert!(e.starts_with("web.yml: "), "{e}");
    assert!(e.contains("unknown field `cert_fil`"), "{e}");
    assert!(e.contains("line 4"), "{e}");
    let e = err("basic_auth:\n  a: b\n");
    assert!(e.contains("unknown field `basic_auth`"), "{e}");
    let e = err("http_server_config:\n  http3: true\n");
    assert!(e.contains("unknown field `http3`"), "{e}");
}

#[test]
fn old_tls_versions_are_refused_with_the_reason() {
    let base = "tls_server_config:\n  cert_file: a\n  key_file: b\n";
    let e = err(&format!("{base}  min_version: TLS10\n"));
    assert!(
        e.contains("tls_server_config.min_version: TLS10: rustls does not support TLS 1.0 or 1.1"),
        "{e}"
    );
    let e = err(&format!("{base}  max_version: TLS99\n"));
    assert!(
        e.contains("tls_server_config.max_version: \"TLS99\""),
        "{e}"
    );
    let e = err(&format!(
        "{base}  min_version: TLS13\n  max_version: TLS12\n"
    ));
    assert!(e.contains("higher than max_version"), "{e}");
    let ok = parse(&format!("{base}  min_version: TLS13\n"), "w").unwrap();
    assert_eq!(ok.tls.unwrap().min_version, TlsVersion::Tls13);
}

#[test]
fn client_auth_types_and_their_requirements() {
    let base = "tls_server_config:\n  cert_file: a\n  key_file: b\n";
    for (name, want) in [
        ("NoClientCert", ClientAuth::NoClientCert),
        ("RequestClientCert", ClientAuth::RequestClientCert),
        ("RequireAnyClientCert", ClientAuth::RequireAnyClientCert),
    ] {
        let c = parse(&format!("{base}  client_auth_type: {name}\n"), "w").unwrap();
        assert_eq!(c.tls.unwrap().client_auth, want);
    }
    let e = err(&format!(
        "{base}  client_auth_type: RequireAndVerifyClientCert\n"
    ));
    assert!(
        e.contains("tls_server_config.client_ca_file: missing"),
        "{e}"
    );
    let e = err(&format!("{base}  client_auth_type: Sometimes\n"));
    assert!(
        e.contains("tls_server_config.client_auth_type: \"Sometimes\""),
        "{e}"
    );
    let e = err(&format!("{base}  client_allowed_sans: [a.example]\n"));
    assert!(
        e.contains("needs client_auth_type RequireAnyClientCert"),
        "{e}"
    );
    let c = parse(
        &format!("{base}  client_auth_type: RequireAnyClientCert\n  client_allowed_sans: [prometheus.monitoring, 10.0.0.1]\n"),
        "w",
    )
    .unwrap();
    assert_eq!(c.tls.unwrap().client_allowed_sans.len(), 2);
}

#[test]
fn cert_and_key_must_come_in_pairs_and_once() {
    let e = err("tls_server_config:\n  cert_file: a\n");
    assert!(e.contains("tls_server_config.key_file: missing"), "{e}");
    let e = err("tls_server_config:\n  key: x\n");
    assert!(e.contains("tls_server_config.cert_file: missing"), "{e}");
    let e = err("tls_server_config:\n  cert: x\n  cert_file: a\n  key_file: b\n");
    assert!(e.contains("set either cert or cert_file"), "{e}");
    let e = err("tls_server_config:\n  client_auth_type: RequireAnyClientCert\n");
    assert!(e.contains("no certificate"), "{e}");
    let c = parse("tls_server_config:\n  cert: CERT\n  key: KEY\n", "w").unwrap();
    assert_eq!(c.tls.unwrap().key, Pem::Inline("KEY".into()));
}

#[test]
fn cipher_suites_and_curves_map_to_rustls_or_are_refused() {
    let base = "tls_server_config:\n  cert_file: a\n  key_file: b\n";
    let c = parse(
        &format!("{base}  cipher_suites: [TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384, TLS_AES_128_GCM_SHA256, TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305]\n  curve_preferences: [X25519, CurveP256]\n"),
        "w",
    )
    .unwrap();
    let t = c.tls.unwrap();
    assert_eq!(
        t.cipher_suites,
        vec![
            CipherSuite::EcdheRsaAes256Gcm,
            CipherSuite::EcdheRsaChacha20
        ]
    );
    assert_eq!(t.curve_preferences, vec![Curve::X25519, Curve::P256]);
    let e = err(&format!(
        "{base}  cipher_suites: [TLS_RSA_WITH_AES_128_CBC_SHA]\n"
    ));
    assert!(e.contains("rustls does not implement this suite"), "{e}");
    let e = err(&format!("{base}  cipher_suites: [FAST]\n"));
    assert!(e.contains("unknown cipher suite"), "{e}");
    let e = err(&format!("{base}  curve_preferences: [CurveP521]\n"));
    assert!(
        e.contains("tls_server_config.curve_preferences: CurveP521"),
        "{e}"
    );
}

#[test]
fn basic_auth_hashes_are_checked() {
    let c = parse(&format!("basic_auth_users:\n  prom: {HASH}\n"), "w").unwrap();
    assert_eq!(c.basic_auth_users["prom"], HASH);
    let e = err("basic_auth_users:\n  prom: hunter2\n");
    assert!(
        e.contains("basic_auth_users.prom: not a bcrypt hash"),
        "{e}"
    );
    let e = err(&format!("basic_auth_users:\n  \"a:b\": {HASH}\n"));
    assert!(e.contains("cannot contain ':'"), "{e}");
}

#[test]
fn a_user_or_header_given_twice_is_refused_with_its_line() {
    let e = err(&format!(
        "basic_auth_users:\n  prom: {HASH}\n  alice: {HASH}\n  prom: {HASH}\n"
    ));
    assert_eq!(
        e,
        "web.yml: basic_auth_users.prom: given twice (YAML keys must be unique), at lines 2 and 4"
    );
    let e = err("http_server_config:\n  headers:\n    X-Frame-Options: deny\n    # again\n    \"X-Frame-Options\": sameorigin\n");
    assert_eq!(
        e,
        "web.yml: http_server_config.headers.X-Frame-Options: given twice (YAML keys must be unique), at lines 3 and 5"
    );
    // Flow style: the mapping is named.
    let e = err(&format!("basic_auth_users: {{a: {HASH}, a: {HASH}}}\n"));
    assert!(e.contains("basic_auth_users.a: given twice"), "{e}");
    // An empty mapping value is still no users.
    assert!(parse("basic_auth_users:\n", "w")
        .unwrap()
        .basic_auth_users
        .is_empty());
}

#[test]
fn headers_are_limited_to_the_toolkit_set() {
    let c = parse(
        "http_server_config:\n  http2: false\n  headers:\n    X-Frame-Options: deny\n    Strict-Transport-Security: max-age=31536000\n    X-XSS-Protection: \"\"\n",
        "w",
    )
    .unwrap();
    assert!(!c.http2);
    assert_eq!(c.headers.len(), 2);
    let e = err("http_server_config:\n  headers:\n    Set-Cookie: a=b\n");
    assert!(
        e.contains("http_server_config.headers.Set-Cookie: this header cannot be configured"),
        "{e}"
    );
    let e = err("http_server_config:\n  headers:\n    X-Content-Type-Options: sniff\n");
    assert!(e.contains("expected nosniff"), "{e}");
}

#[test]
fn rate_limit_parses_and_zero_disables_it() {
    let c = parse("rate_limit:\n  interval: 100ms\n  burst: 5\n", "w").unwrap();
    assert_eq!(
        c.rate_limit,
        Some(RateLimit {
            interval: Duration::from_millis(100),
            burst: 5
        })
    );
    assert_eq!(
        parse("rate_limit:\n  interval: 0\n  burst: 5\n", "w")
            .unwrap()
            .rate_limit,
        None
    );
    // Go's syntax, as exporter-toolkit reads it (time.ParseDuration).
    for (text, want) in [
        ("1h30m", Duration::from_secs(5400)),
        ("1.5s", Duration::from_millis(1500)),
        ("500us", Duration::from_micros(500)),
    ] {
        let c = parse(
            &format!("rate_limit:\n  interval: {text}\n  burst: 5\n"),
            "w",
        );
        assert_eq!(c.unwrap().rate_limit.unwrap().interval, want, "{text}");
    }
    let e = err("rate_limit:\n  interval: fast\n  burst: 5\n");
    assert!(e.contains("rate_limit.interval"), "{e}");
    let e = err("rate_limit:\n  interval: 1s\n");
    assert!(e.contains("rate_limit.burst"), "{e}");
}

#[test]
fn wrong_types_are_named() {
    let e = err(
        "tls_server_config:\n  cert_file: a\n  key_file: b\n  prefer_server_cipher_suites: maybe\n",
    );
    assert!(e.contains("prefer_server_cipher_suites"), "{e}");
    let e = err("- just\n- a list\n");
    assert!(e.starts_with("web.yml: "), "{e}");
}

#[test]
fn the_config_and_its_pem_files_are_read_through_the_bounded_reader() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("web.yml");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &fifo,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    // A FIFO would block the reader (and, for a key file, every new connection) for ever.
    let e = crate::error_chain(&load(&fifo).unwrap_err());
    assert!(
        e.ends_with("web.yml: is a FIFO (named pipe), not a regular file; refused"),
        "{e}"
    );
    let e = crate::web::tls::read_pem_file(&fifo).unwrap_err();
    assert_eq!(e.reason(), "not_regular");
    let e = crate::error_chain(&load(std::path::Path::new("/dev/zero")).unwrap_err());
    assert!(
        e.ends_with("/dev/zero: is a character device, not a regular file; refused"),
        "{e}"
    );
    // A Secret mount: the key is a link through ..data, and is read.
    std::fs::create_dir(dir.path().join("..v1")).unwrap();
    std::fs::write(dir.path().join("..v1/tls.key"), "key").unwrap();
    std::os::unix::fs::symlink("..v1", dir.path().join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/tls.key", dir.path().join("tls.key")).unwrap();
    assert_eq!(
        crate::web::tls::read_pem_file(&dir.path().join("tls.key")).unwrap(),
        b"key"
    );
}

#[test]
fn deep_nesting_is_refused_before_it_is_parsed() {
    let flow = format!(
        "tls_server_config:\n  cipher_suites: {}{}\n",
        "[".repeat(200),
        "]".repeat(200)
    );
    assert_eq!(
        err(&flow),
        "web.yml:2: nested more than 64 levels deep; refused"
    );
    let dashes = format!("basic_auth_users:\n  {}x\n", "- ".repeat(200));
    assert_eq!(
        err(&dashes),
        "web.yml:2: nested more than 64 levels deep; refused"
    );
}

#[test]
fn a_byte_order_mark_is_ignored() {
    let c = parse(
        "\u{feff}http_server_config:\n  headers:\n    X-Frame-Options: deny\n",
        "web.yml",
    )
    .unwrap();
    assert_eq!(
        c.headers,
        [("X-Frame-Options".to_owned(), "deny".to_owned())]
    );
    assert_eq!(
        parse("\u{feff}", "web.yml").unwrap(),
        parse("", "web.yml").unwrap()
    );
}
