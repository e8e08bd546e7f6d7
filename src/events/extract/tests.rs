//! The extractors on events of every shape: paths, composite keys, content digests,
//! time buckets.

use std::time::Duration;

use chrono::DateTime;
use serde_json::json;

use super::*;
use crate::key::HashAlgorithm;

#[test]
fn field_paths_reach_nested_values_and_name_the_field_when_they_cannot() {
    let event = json!({"id": 42, "ok": true, "data": {"user": {"id": "u-1"}, "items": [{"sku": "s-9"}]},
                       "empty": "", "nothing": null, "list": [1]});
    let get = |p: &str| FieldExtractor::new(p).unwrap().extract(&event);
    assert_eq!(get("id").unwrap(), "42");
    assert_eq!(get("ok").unwrap(), "true");
    assert_eq!(get("data.user.id").unwrap(), "u-1");
    assert_eq!(get("data.items.0.sku").unwrap(), "s-9");
    assert_eq!(
        get("data.items.1.sku").unwrap_err(),
        EventError::MissingField {
            field: "data.items.1.sku".into()
        }
    );
    assert_eq!(
        get("data.user").unwrap_err().to_string(),
        "field `data.user` is an object, expected a string, number or boolean"
    );
    assert_eq!(
        get("nothing").unwrap_err().to_string(),
        "field `nothing` is null, expected a string, number or boolean"
    );
    assert_eq!(
        get("empty").unwrap_err().to_string(),
        "field `empty` is invalid: it is an empty string"
    );
    assert_eq!(get("list").unwrap_err().field(), Some("list"));
    assert!(matches!(
        FieldExtractor::new("id").unwrap().extract(&json!([1])),
        Err(EventError::Malformed { .. })
    ));
    for bad in ["", ".", "a..b", "a."] {
        assert!(FieldExtractor::new(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn composite_joins_in_order_and_escapes_the_separator() {
    let key = CompositeExtractor::new(["tenant", "user.id", "n"], "::").unwrap();
    assert_eq!(
        key.extract(&json!({"tenant": "acme", "user": {"id": "u1"}, "n": 3}))
            .unwrap(),
        "acme::u1::3"
    );
    let a = key
        .extract(&json!({"tenant": "a::b", "user": {"id": "c"}, "n": 1}))
        .unwrap();
    let b = key
        .extract(&json!({"tenant": "a", "user": {"id": "b::c"}, "n": 1}))
        .unwrap();
    assert_eq!(a, r"a\::b::c::1");
    assert_ne!(a, b);
    let c = key
        .extract(&json!({"tenant": "a\\", "user": {"id": "x"}, "n": 1}))
        .unwrap();
    assert_eq!(c, r"a\\::x::1");
    assert_eq!(
        key.extract(&json!({"tenant": "acme", "n": 3}))
            .unwrap_err()
            .to_string(),
        "field `user.id` is missing"
    );
    assert!(CompositeExtractor::new(Vec::<&str>::new(), ":").is_err());
    assert!(CompositeExtractor::new(["a"], "").is_err());
    assert!(CompositeExtractor::new(["a"], "\\").is_err());
}

#[test]
fn content_hash_covers_included_minus_excluded_fields() {
    let event = json!({"id": "e1", "timestamp": "2025-11-18T09:00:00Z",
                       "amount": "10.00", "meta": {"source": "feed", "seq": 7}});
    let all = ContentHashExtractor::new();
    assert_eq!(
        all.extract(&event).unwrap(),
        crate::digest_value(&event, HashAlgorithm::Sha256)
    );
    let without = ContentHashExtractor::new()
        .exclude(["id", "timestamp", "meta.seq"])
        .unwrap();
    assert_eq!(
        without.content(&event).unwrap(),
        json!({"amount": "10.00", "meta": {"source": "feed"}})
    );
    let only = ContentHashExtractor::new()
        .include(["amount", "meta.source", "absent"])
        .unwrap()
        .algorithm(HashAlgorithm::Md5);
    assert_eq!(
        only.content(&event).unwrap(),
        json!({"amount": "10.00", "meta": {"source": "feed"}})
    );
    let md5 = only.extract(&event).unwrap();
    assert_eq!(md5.len(), 32);
    assert_eq!(
        md5,
        crate::digest_value(
            &json!({"amount": "10.00", "meta": {"source": "feed"}}),
            HashAlgorithm::Md5
        )
    );
    // Key order in the input does not matter; a changed value does.
    let reordered: Value = serde_json::from_str(
        r#"{"meta": {"seq": 8, "source": "feed"}, "amount": "10.00", "timestamp": "x", "id": "e2"}"#,
    )
    .unwrap();
    assert_eq!(
        without.extract(&reordered).unwrap(),
        without.extract(&event).unwrap()
    );
    let changed = json!({"amount": "10.01", "meta": {"source": "feed"}});
    assert_ne!(
        without.extract(&changed).unwrap(),
        without.extract(&event).unwrap()
    );
    assert!(matches!(
        all.extract(&json!("text")),
        Err(EventError::Malformed { .. })
    ));
}

#[test]
fn time_bucket_uses_the_event_timestamp_not_the_clock() {
    let hourly = TimeBucketExtractor::new(
        "at",
        Duration::from_secs(3600),
        FieldExtractor::new("id").unwrap(),
    )
    .unwrap();
    // An event from 1970: with the seed's wall-clock bucket this would be "now".
    assert_eq!(
        hourly
            .extract(&json!({"at": "1970-01-01T01:30:00Z", "id": "a"}))
            .unwrap(),
        "1:a"
    );
    assert_eq!(
        hourly
            .extract(&json!({"at": "1969-12-31T23:59:59Z", "id": "a"}))
            .unwrap(),
        "-1:a"
    );
    let t = "2025-11-18T09:59:59.999999Z";
    let expected = DateTime::parse_from_rfc3339(t).unwrap().timestamp() / 3600;
    assert_eq!(
        hourly.extract(&json!({"at": t, "id": "a"})).unwrap(),
        format!("{expected}:a")
    );
    assert_eq!(
        hourly.extract(&json!({"id": "a"})).unwrap_err().to_string(),
        "field `at` is missing"
    );
    assert_eq!(
        hourly
            .extract(&json!({"at": 1763456400, "id": "a"}))
            .unwrap_err()
            .to_string(),
        "field `at` is a number, expected an RFC 3339 timestamp string"
    );
    assert_eq!(
        hourly
            .extract(&json!({"at": "yesterday", "id": "a"}))
            .unwrap_err()
            .field(),
        Some("at")
    );
    // The inner extractor's failure names its own field.
    assert_eq!(
        hourly.extract(&json!({"at": t})).unwrap_err().to_string(),
        "field `id` is missing"
    );
    assert!(TimeBucketExtractor::new("at", Duration::ZERO, ContentHashExtractor::new()).is_err());
}

#[test]
fn extractors_work_behind_a_box() {
    let boxed: Vec<Box<dyn Extractor>> = vec![
        Box::new(FieldExtractor::new("id").unwrap()),
        Box::new(ContentHashExtractor::new()),
    ];
    let event = json!({"id": "x"});
    assert_eq!(boxed[0].extract(&event).unwrap(), "x");
    assert_eq!(boxed[1].extract(&event).unwrap().len(), 64);
}
