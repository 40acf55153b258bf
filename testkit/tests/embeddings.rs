//! Black-box tests of `FakeEmbeddings` through a real HTTP client.

// A failed unwrap in a test is the test failing.
#![allow(clippy::unwrap_used)]

use parlor_testkit::FakeEmbeddings;
use parlor_testkit::embeddings::{BUCKETS, cosine};
use serde_json::{Value, json};

mod support;
use support::{WAIT, client};

fn groups() -> Vec<Vec<String>> {
    [
        &["car", "automobile", "vehicle"][..],
        &["book", "reserve"],
        &["生日", "出生"],
        &["flight", "plane"],
    ]
    .iter()
    .map(|g| g.iter().map(|w| (*w).to_owned()).collect())
    .collect()
}

async fn post(fake: &FakeEmbeddings, path: &str, body: &Value) -> (u16, Value) {
    let addr = fake.addr();
    let response = client()
        .post(format!("http://{addr}{path}"))
        .bearer_auth("sk-test")
        .json(body)
        .send()
        .await
        .expect("request to fake embeddings");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

fn vector(item: &Value) -> Vec<f32> {
    item["embedding"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

fn close(a: f32, b: f32) -> bool {
    (a - b).abs() < 1e-5
}

#[tokio::test]
async fn synonyms_share_a_dimension_and_forms_meet() {
    let fake = FakeEmbeddings::start(groups()).await;
    let (status, body) = post(
        &fake,
        "/v1/embeddings",
        &json!({"model": "m", "input": ["car", "automobile", "What automobiles does Bob have?"]}),
    )
    .await;
    assert_eq!(status, 200, "{body:#}");
    let data = body["data"].as_array().unwrap();
    let (car, automobile) = (vector(&data[0]), vector(&data[1]));
    assert_eq!(car.len(), groups().len() + BUCKETS);
    assert_eq!(fake.dimensions(), car.len());
    assert!(close(cosine(&car, &automobile), 1.0));
    assert!(close(car[0], 1.0), "group 0 is car's dimension: {car:?}");
    // "automobiles" loses its `s`; "bob" and "have" go to buckets; stop words count for
    // nothing.
    let question = vector(&data[2]);
    let norm: f32 = question.iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!(close(norm, 1.0));
    assert!(close(question[0], 1.0 / 3f32.sqrt()), "{question:?}");
    assert!(close(
        cosine(&fake.embed("booked"), &fake.embed("reserves")),
        1.0
    ));
    assert!(close(
        cosine(&fake.embed("a car"), &fake.embed("a plane")),
        0.0
    ));
    // Chinese members count by substring, spaces or not.
    assert!(close(
        cosine(&fake.embed("小明哪天过生日"), &fake.embed("他出生在五月")),
        1.0
    ));
    // Nothing counted: zeros, not NaNs.
    assert!(fake.embed("the of what 天气").iter().all(|&x| x == 0.0));
    assert_eq!(fake.requests(), 1);
    assert_eq!(fake.inputs(), 3);
}

#[tokio::test]
async fn a_batch_answers_in_input_order_on_both_paths() {
    let fake = FakeEmbeddings::start(groups()).await;
    let inputs = ["zebra crossing", "a car", "plane tickets", "出生日期"];
    let (status, body) = post(
        &fake,
        "/embeddings",
        &json!({"model": "text-embedding-3-small", "input": inputs}),
    )
    .await;
    assert_eq!(status, 200, "{body:#}");
    assert_eq!(body["object"], "list");
    assert_eq!(body["model"], "text-embedding-3-small");
    assert!(body["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
    assert_eq!(
        body["usage"]["prompt_tokens"],
        body["usage"]["total_tokens"]
    );
    let data = body["data"].as_array().unwrap();
    assert_eq!(data.len(), inputs.len());
    for (i, (item, text)) in data.iter().zip(inputs).enumerate() {
        assert_eq!(item["object"], "embedding");
        assert_eq!(item["index"], i);
        assert_eq!(vector(item), fake.embed(text), "{text}");
        // One text alone gets the vector it got in the batch.
        let (_, single) = post(&fake, "/v1/embeddings", &json!({"input": text})).await;
        assert_eq!(vector(&single["data"][0]), fake.embed(text));
        assert_eq!(single["model"], "fake-embeddings");
    }
    // base64: the same floats, little-endian.
    let (_, encoded) = post(
        &fake,
        "/v1/embeddings",
        &json!({"input": "a car", "encoding_format": "base64"}),
    )
    .await;
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded["data"][0]["embedding"].as_str().unwrap())
        .unwrap();
    let floats: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!(floats, fake.embed("a car"));
    assert_eq!(fake.requests(), 2 + inputs.len());
    assert_eq!(fake.inputs(), 2 * inputs.len() + 1);
    fake.shutdown().await;
}

#[tokio::test]
async fn fail_next_answers_500s_then_serves_again() {
    let fake = FakeEmbeddings::start(groups()).await;
    fake.fail_next(2);
    for _ in 0..2 {
        let (status, body) = post(&fake, "/v1/embeddings", &json!({"input": "car"})).await;
        assert_eq!(status, 500);
        assert_eq!(body["error"]["type"], "server_error", "{body:#}");
        assert!(body["error"]["message"].as_str().unwrap().contains("fake"));
    }
    let (status, _) = post(&fake, "/v1/embeddings", &json!({"input": "car"})).await;
    assert_eq!(status, 200);
    assert_eq!(fake.requests(), 3);
    assert_eq!(fake.inputs(), 1);
}

#[tokio::test]
async fn missing_or_empty_input_is_a_400() {
    let fake = FakeEmbeddings::start(groups()).await;
    for body in [
        json!({"model": "m"}),
        json!({"model": "m", "input": ""}),
        json!({"model": "m", "input": []}),
        json!({"model": "m", "input": ["car", ""]}),
        json!({"model": "m", "input": [1, 2, 3]}),
    ] {
        let (status, answer) = post(&fake, "/v1/embeddings", &body).await;
        assert_eq!(status, 400, "{body}");
        assert_eq!(
            answer["error"]["type"], "invalid_request_error",
            "{answer:#}"
        );
    }
    assert_eq!(fake.requests(), 5);
    assert_eq!(fake.inputs(), 0);
    let (status, _) = post(&fake, "/v1/chat/completions", &json!({"input": "car"})).await;
    assert_eq!(status, 404);
    assert_eq!(
        fake.requests(),
        5,
        "another path is not an embeddings request"
    );
}

#[tokio::test]
async fn a_stopped_fake_refuses_connections() {
    let fake = FakeEmbeddings::start(groups()).await;
    let url = format!("{}/embeddings", fake.base_url());
    fake.shutdown().await;
    let sent = tokio::time::timeout(
        WAIT,
        client().post(&url).json(&json!({"input": "car"})).send(),
    )
    .await
    .expect("a refused connection is quick");
    assert!(sent.is_err(), "{sent:?}");
}
