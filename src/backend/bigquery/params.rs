//! Typed query parameters (`@name`) for GoogleSQL statements.

use chrono::{DateTime, NaiveDate, Utc};
use gcp_bigquery_client::model::query_parameter::QueryParameter;
use gcp_bigquery_client::model::query_parameter_type::QueryParameterType;
use gcp_bigquery_client::model::query_parameter_type_struct_types::QueryParameterTypeStructTypes;
use gcp_bigquery_client::model::query_parameter_value::QueryParameterValue;

/// A query parameter (re-exported so tests and callers need not name the crate's model).
pub type Param = QueryParameter;

fn scalar(name: &str, ty: &str, value: Option<String>) -> Param {
    QueryParameter {
        name: Some(name.to_string()),
        parameter_type: Some(QueryParameterType {
            array_type: None,
            struct_types: None,
            r#type: ty.to_string(),
        }),
        parameter_value: Some(QueryParameterValue {
            array_values: None,
            struct_values: None,
            value,
        }),
    }
}

/// A STRING parameter.
pub fn string(name: &str, value: &str) -> Param {
    scalar(name, "STRING", Some(value.to_string()))
}

/// A STRING parameter that may be NULL.
pub fn opt_string(name: &str, value: Option<&str>) -> Param {
    scalar(name, "STRING", value.map(str::to_string))
}

/// An INT64 parameter.
pub fn int64(name: &str, value: i64) -> Param {
    scalar(name, "INT64", Some(value.to_string()))
}

/// An INT64 parameter that may be NULL.
pub fn opt_int64(name: &str, value: Option<i64>) -> Param {
    scalar(name, "INT64", value.map(|v| v.to_string()))
}

/// RFC 3339 in UTC with microseconds and a `Z` (without an offset the emulator reads a
/// DATETIME).
pub fn timestamp_text(t: DateTime<Utc>) -> String {
    crate::model::time::micros_text(t)
}

/// A TIMESTAMP parameter.
pub fn timestamp(name: &str, value: DateTime<Utc>) -> Param {
    scalar(name, "TIMESTAMP", Some(timestamp_text(value)))
}

/// A DATE parameter.
pub fn date(name: &str, value: NaiveDate) -> Param {
    scalar(name, "DATE", Some(crate::model::time::day_text(value)))
}

/// An `ARRAY<STRING>` parameter.
pub fn string_array(name: &str, values: &[String]) -> Param {
    QueryParameter {
        name: Some(name.to_string()),
        parameter_type: Some(QueryParameterType {
            array_type: Some(Box::new(QueryParameterType {
                array_type: None,
                struct_types: None,
                r#type: "STRING".into(),
            })),
            struct_types: None,
            r#type: "ARRAY".into(),
        }),
        parameter_value: Some(QueryParameterValue {
            array_values: Some(
                values
                    .iter()
                    .map(|v| QueryParameterValue {
                        array_values: None,
                        struct_values: None,
                        value: Some(v.clone()),
                    })
                    .collect(),
            ),
            struct_values: None,
            value: None,
        }),
    }
}

/// An `ARRAY<STRUCT<…>>` parameter: `fields` are (name, scalar type); each row gives one
/// value per field (`None` = NULL). Read it with `FROM UNNEST(@name) AS r` and `r.field`.
pub fn struct_array(name: &str, fields: &[(&str, &str)], rows: Vec<Vec<Option<String>>>) -> Param {
    let struct_types = fields
        .iter()
        .map(|(field, ty)| QueryParameterTypeStructTypes {
            description: None,
            name: Some(field.to_string()),
            r#type: Some(QueryParameterType {
                array_type: None,
                struct_types: None,
                r#type: ty.to_string(),
            }),
        })
        .collect();
    let values = rows
        .into_iter()
        .map(|row| QueryParameterValue {
            array_values: None,
            struct_values: Some(
                fields
                    .iter()
                    .zip(row)
                    .map(|((field, _), value)| {
                        (
                            field.to_string(),
                            QueryParameterValue {
                                array_values: None,
                                struct_values: None,
                                value,
                            },
                        )
                    })
                    .collect(),
            ),
            value: None,
        })
        .collect();
    QueryParameter {
        name: Some(name.to_string()),
        parameter_type: Some(QueryParameterType {
            array_type: Some(Box::new(QueryParameterType {
                array_type: None,
                struct_types: Some(struct_types),
                r#type: "STRUCT".into(),
            })),
            struct_types: None,
            r#type: "ARRAY".into(),
        }),
        parameter_value: Some(QueryParameterValue {
            array_values: Some(values),
            struct_values: None,
            value: None,
        }),
    }
}
