//! Postgres over TLS, against private clusters this suite starts: one serving
//! a certificate from a private CA (for `localhost` only), one without TLS.
//! Each `sslmode` connects or fails as libpq's would, and a failure names its
//! cause (an unknown issuer, a name the certificate does not cover, a server
//! without TLS).

use std::sync::Arc;

use pinned_store::{
    ConnectionString, InstanceKey, PostgresOptions, PostgresStore, SslMode, StateStore, StoreError,
    TrayKey,
};
use serde_json::json;
use test_support::{unique, PostgresCluster, PrivateCa, ServerTls};

/// The store at `url`: opened (tables created), a row written and read back.
async fn open_and_use(url: &str) -> Result<Arc<PostgresStore>, StoreError> {
    let store = Arc::new(PostgresStore::open(url, PostgresOptions::default()).await?);
    let a = InstanceKey::new("/tls", "a");
    let doc = json!({"n": 1}).as_object().cloned().unwrap_or_default();
    store
        .set_tray(a, TrayKey::singleton("t"), false, doc.clone(), 1)
        .await?;
    let tray = store.get_tray(a, TrayKey::singleton("t"), 1).await?;
    assert_eq!(tray.map(|t| t.doc), Some(doc));
    Ok(store)
}

/// Whether the backends of `application_name` talk TLS, as the server sees it
/// (every one of them must agree).
async fn backends_use_tls(admin: &str, application_name: &str) -> bool {
    let target = ConnectionString::parse(admin).expect("admin url");
    let (client, conn) = target.connect().await.expect("admin connect");
    tokio::spawn(conn);
    let row = client
        .query_one(
            "SELECT count(*), count(*) FILTER (WHERE s.ssl) FROM pg_stat_ssl s \
             JOIN pg_stat_activity a USING (pid) WHERE a.application_name = $1",
            &[&application_name],
        )
        .await
        .expect("pg_stat_ssl");
    let (all, tls): (i64, i64) = (row.get(0), row.get(1));
    assert!(all > 0, "no backend of {application_name}");
    all == tls
}

fn port_of(cluster: &PostgresCluster) -> u16 {
    cluster.port()
}

#[tokio::test]
async fn sslmodes_against_a_server_with_a_private_ca() {
    let ca = PrivateCa::new();
    let issued = ca.issue(&["localhost"]);
    let cluster = PostgresCluster::start_tls(&ServerTls {
        cert_pem: issued.cert_pem,
        key_pem: issued.key_pem,
    });
    let port = port_of(&cluster);
    let ca_file = ca.cert_file.display().to_string();
    let admin = format!("{}?sslmode=disable", cluster.url);

    // require: encrypted, the certificate not checked (its name is not 127.0.0.1).
    let app = format!("require-{}", unique());
    let url = format!(
        "postgresql://postgres@127.0.0.1:{port}/postgres?sslmode=require&application_name={app}"
    );
    let store = open_and_use(&url).await.expect("sslmode=require");
    assert!(
        backends_use_tls(&admin, &app).await,
        "require did not use TLS"
    );
    drop(store);

    // verify-full with the right CA and the certificate's name, key=value form.
    let app = format!("full-{}", unique());
    let kv = format!(
        "host=localhost port={port} user=postgres dbname=postgres sslmode=verify-full \
         sslrootcert='{ca_file}' application_name={app}"
    );
    assert_eq!(
        ConnectionString::parse(&kv).expect("kv").ssl_mode(),
        SslMode::VerifyFull
    );
    let store = open_and_use(&kv).await.expect("verify-full, right CA");
    assert!(backends_use_tls(&admin, &app).await);
    drop(store);

    // verify-ca checks the chain, not the name: 127.0.0.1 is not in the certificate.
    let url = format!(
        "postgresql://postgres@127.0.0.1:{port}/postgres?sslmode=verify-ca&sslrootcert={ca_file}"
    );
    open_and_use(&url).await.expect("verify-ca, right CA");

    // verify-full with another CA: the issuer is unknown.
    let other = PrivateCa::new();
    let url = format!(
        "postgresql://postgres@localhost:{port}/postgres?sslmode=verify-full&sslrootcert={}",
        other.cert_file.display()
    );
    let err = open_and_use(&url).await.expect_err("wrong CA");
    let text = err.to_string();
    assert!(
        text.contains("TLS handshake") && text.contains("UnknownIssuer"),
        "wrong CA: {text}"
    );
    // The same with verify-ca, and with require given the wrong root (libpq: a
    // root certificate makes `require` check the chain).
    for mode in ["verify-ca", "require"] {
        let url = format!(
            "postgresql://postgres@127.0.0.1:{port}/postgres?sslmode={mode}&sslrootcert={}",
            other.cert_file.display()
        );
        let text = open_and_use(&url).await.expect_err(mode).to_string();
        assert!(text.contains("UnknownIssuer"), "{mode}: {text}");
    }

    // verify-full with the right CA but a name the certificate does not cover.
    let url = format!(
        "postgresql://postgres@127.0.0.1:{port}/postgres?sslmode=verify-full&sslrootcert={ca_file}"
    );
    let text = open_and_use(&url)
        .await
        .expect_err("wrong hostname")
        .to_string();
    assert!(
        text.contains("TLS handshake") && text.contains("not valid for name"),
        "wrong hostname: {text}"
    );
    assert!(text.contains("127.0.0.1"), "the name tried: {text}");

    // prefer (the default) takes TLS when offered; disable does not.
    let app = format!("prefer-{}", unique());
    let url = format!("{}?application_name={app}", cluster.url);
    let _store = open_and_use(&url).await.expect("prefer");
    assert!(
        backends_use_tls(&admin, &app).await,
        "prefer did not use TLS"
    );
    let app = format!("disable-{}", unique());
    let url = format!("{}?sslmode=disable&application_name={app}", cluster.url);
    let _store = open_and_use(&url).await.expect("disable");
    assert!(!backends_use_tls(&admin, &app).await, "disable used TLS");
}

#[tokio::test]
async fn a_server_without_tls_refuses_require_and_serves_prefer() {
    let cluster = PostgresCluster::start();
    let url = format!("{}?sslmode=require", cluster.url);
    let err = open_and_use(&url).await.expect_err("require, no TLS");
    assert!(matches!(err, StoreError::Unavailable { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("server does not support TLS"), "{text}");

    open_and_use(&cluster.url).await.expect("prefer falls back");
}

#[tokio::test]
async fn an_unsupported_sslmode_is_refused_before_dialling() {
    for url in [
        "postgresql://postgres@127.0.0.1:1/db?sslmode=allow",
        "host=127.0.0.1 port=1 sslmode=verify-everything",
    ] {
        let err = PostgresStore::connect(url, PostgresOptions::default()).expect_err(url);
        assert!(
            matches!(
                err,
                StoreError::ConnectionString(
                    pinned_store::ConnectionStringError::UnsupportedSslMode { .. }
                )
            ),
            "{url}: {err:?}"
        );
        assert!(err.to_string().starts_with("unsupported sslmode"), "{err}");
        assert!(!err.retryable());
    }
}
