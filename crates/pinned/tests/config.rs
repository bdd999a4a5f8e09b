//! Configuration errors are reported together, at construction.

use axum::Router;
use pinned::{BoxError, ConfigError, Context, HostOptions, Object, Options};

struct Nothing;

impl Object for Nothing {
    async fn activate(_ctx: &Context) -> Result<Self, BoxError> {
        Ok(Nothing)
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new()
    }
}

fn empty_env() -> Vec<(String, String)> {
    Vec::new()
}

#[test]
fn namespaces_must_be_one_segment_and_unique() {
    for bad in ["counter", "/a/b", "/", "/a b", ""] {
        let errors = Options::new()
            .host::<Nothing>(bad)
            .env_vars(empty_env())
            .build()
            .err()
            .unwrap_or_else(|| panic!("{bad:?} accepted"));
        assert!(
            matches!(errors.0.as_slice(), [ConfigError::InvalidNamespace(_)]),
            "{bad:?}: {errors}"
        );
    }
    let errors = Options::new()
        .host::<Nothing>("counter")
        .env_vars(empty_env())
        .build()
        .err()
        .expect("rejected");
    assert_eq!(
        errors.to_string(),
        "namespace must be '/' plus a single path segment: 'counter'"
    );
    let errors = Options::new()
        .host::<Nothing>("/x")
        .host::<Nothing>("/x")
        .env_vars(empty_env())
        .build()
        .err()
        .expect("rejected");
    assert_eq!(
        errors.to_string(),
        "namespace '/x' already attached to this worker"
    );
    // One object under several namespaces is fine.
    assert!(Options::new()
        .host::<Nothing>("/x")
        .host::<Nothing>("/y")
        .env_vars(empty_env())
        .build()
        .is_ok());
}

#[test]
fn every_problem_is_reported_at_once() {
    let errors = Options::new()
        .host_with::<Nothing>("/a", HostOptions::default().max_instances(0))
        .host::<Nothing>("bad")
        .env_vars([("PORT", "eighty")])
        .build()
        .err()
        .expect("rejected");
    assert_eq!(errors.0.len(), 3, "{errors}");
    assert!(errors.contains(&ConfigError::MaxInstances("/a".into())));
    assert!(errors.contains(&ConfigError::Port("eighty".into())));
    let errors = Options::new()
        .env_vars(empty_env())
        .build()
        .err()
        .expect("rejected");
    assert!(errors.contains(&ConfigError::NoHosts));
}

#[test]
fn dev_mode_refuses_production_unless_allowed() {
    for (variable, value) in [
        ("NODE_ENV", "production"),
        ("ENVIRONMENT", "prod"),
        ("APP_ENV", "Production"),
    ] {
        let errors = Options::new()
            .host::<Nothing>("/x")
            .env_vars([(variable, value)])
            .build()
            .err()
            .expect("refused in production");
        assert!(
            matches!(
                errors.0.as_slice(),
                [ConfigError::DevModeInProduction { .. }]
            ),
            "{errors}"
        );
    }
    assert!(Options::new()
        .host::<Nothing>("/x")
        .env_vars([
            ("NODE_ENV", "production"),
            ("PINBOARD_ALLOW_DEV_IN_PRODUCTION", "1")
        ])
        .build()
        .is_ok());
    assert!(Options::new()
        .host::<Nothing>("/x")
        .env_vars([("NODE_ENV", "development")])
        .build()
        .is_ok());
}

#[test]
fn a_zero_advertise_port_is_refused_by_build() {
    let errors = Options::new()
        .host::<Nothing>("/n")
        .env_vars(empty_env())
        .pinboard("http://127.0.0.1:7070", "t", "http://127.0.0.1:0")
        .build()
        .err()
        .expect("refused: nothing binds for a built worker");
    assert_eq!(
        errors.0,
        [ConfigError::UnboundAdvertisePort(
            "http://127.0.0.1:0".into()
        )]
    );
}

#[test]
fn settings_made_in_code_survive_an_environment_that_does_not_name_them() {
    // Control-plane settings, then an environment without them: still
    // control-plane mode (the empty URL is refused, not forgotten).
    let errors = Options::new()
        .host::<Nothing>("/n")
        .pinboard("", "token", "http://127.0.0.1:1")
        .env_vars(empty_env())
        .build()
        .err()
        .expect("an empty pinboard URL was forgotten, not refused");
    assert!(errors.contains(&ConfigError::EmptyPinboardUrl), "{errors}");
    // A variable that names another value wins.
    let built = Options::new()
        .host::<Nothing>("/n")
        .pinboard("", "token", "http://127.0.0.1:1")
        .env_vars([("PINBOARD_URL", "http://127.0.0.1:2")])
        .build();
    assert!(built.is_ok(), "{:?}", built.err());
    // The same for the port: set in code, kept; named by `PORT`, replaced.
    let port_only = |vars: Vec<(&str, &str)>| {
        Options::new()
            .host::<Nothing>("/n")
            .port(8080)
            .env_vars(vars)
            .build()
            .err()
    };
    assert!(port_only(vec![]).is_none());
    let errors = port_only(vec![("PORT", "eighty")]).expect("PORT named a bad port");
    assert!(
        errors.contains(&ConfigError::Port("eighty".into())),
        "{errors}"
    );
}
