//! Shops and their ledger: each order a shop takes is sent to a ledger
//! object as a message, exactly once, in the order taken, across crashes
//! and moves of either side.
//!
//! ```text
//! PORT=8080 cargo run --example orders
//! curl -X POST localhost:8080/shops/s1/orders \
//!      -H 'content-type: application/json' -d '{"n":1,"ledger":"main"}'
//! curl localhost:8080/ledgers/main/lines
//! ```
//!
//! A shop admits an order once per number (`admit_once`, so a client may
//! post it again after a lost answer); its tray's handler sends the order
//! to the ledger with [`TrayCtx::send`], which lands with the order's ack.
//! The ledger's tray [`Receive`]s it (a repeat is answered without
//! admitting it again) and its handler writes the line.
//!
//! Store: `DATABASE_URL` (Postgres) when set, else the SQLite file
//! `PINNED_DB_PATH` (default `pinned.db`). Local mode by default;
//! `PINBOARD_URL`, `PINBOARD_TOKEN` and `ADVERTISE_URL` put it behind
//! pinboard. `ORDERS_WORK_MS` (default 0) is how long a shop's handler
//! works on an order before sending it.
//!
//! Test fixture, off unless set: `ORDERS_DIE_AFTER_BOOKING=<n>` aborts the
//! process right after the write that admits the ledger's n-th booking
//! has landed, before the ledger answers its sender (the store is wrapped
//! in [`AbortAfterWrite`]). The sender is left without its answer and
//! delivers the booking again once the process restarts (without the
//! variable): the ledger answers it as a repeat and books it once.

use std::time::Duration;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use pinned::pinned_store::StoreConfig;
use pinned::tray::{
    Fields, Queue, Receive, Recipient, Tray, TrayCtx, TrayError, TrayHandler, Trays, Value,
};
use pinned::{BoxError, Context, Object, Options};
use pinned_examples::crash_point::AbortAfterWrite;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// The ledgers' namespace.
const LEDGERS: &str = "/ledgers";

/// An order as a shop takes it.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Order {
    n: u64,
    /// The ledger it is booked in.
    ledger: String,
}

/// What a ledger receives: which shop, which order.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Booking {
    shop: String,
    n: u64,
}

#[derive(Default)]
struct Orders {
    queue: Queue<Order>,
}

impl Tray for Orders {
    const NAME: &'static str = "orders";
    type Item = Order;

    fn fields(&mut self, fields: &mut Fields<'_>) {
        fields.field("queue", &mut self.queue);
    }

    fn head(&self) -> Option<Order> {
        self.queue.front().cloned()
    }

    fn ack(&mut self, _order: &Order) {
        self.queue.pop_front();
    }
}

#[derive(Default)]
struct Book {
    inbox: Queue<Booking>,
    lines: Value<Vec<String>>,
    /// Bookings admitted, ever: one per message, a repeat not counted.
    received: Value<u64>,
}

impl Tray for Book {
    const NAME: &'static str = "book";
    type Item = Booking;

    fn fields(&mut self, fields: &mut Fields<'_>) {
        fields.field("inbox", &mut self.inbox);
        fields.field("lines", &mut self.lines);
        fields.field("received", &mut self.received);
    }

    fn head(&self) -> Option<Booking> {
        self.inbox.front().cloned()
    }

    fn ack(&mut self, _booking: &Booking) {
        self.inbox.pop_front();
    }
}

impl Receive for Book {
    type Message = Booking;

    fn receive(&mut self, booking: Booking) {
        self.inbox.push_back(booking);
        *self.received += 1;
    }
}

struct Shop {
    work: Duration,
}

impl Object for Shop {
    async fn activate(_ctx: &Context) -> Result<Self, BoxError> {
        let ms = std::env::var("ORDERS_WORK_MS")
            .ok()
            .and_then(|ms| ms.parse().ok())
            .unwrap_or(0);
        Ok(Shop {
            work: Duration::from_millis(ms),
        })
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new().route("/orders", post(place))
    }

    fn trays() -> Trays<Self> {
        Trays::new().singleton::<Orders>()
    }
}

impl TrayHandler<Orders> for Shop {
    async fn handle(&self, ctx: TrayCtx<Orders>, order: Order) -> Result<(), BoxError> {
        if !self.work.is_zero() {
            tokio::time::sleep(self.work).await;
        }
        let booking = Booking {
            shop: ctx.context().id().to_owned(),
            n: order.n,
        };
        // Queued with the order's ack, in the same row write: sent exactly
        // when the order is done, however often the handler runs.
        ctx.send::<Book>(&Recipient::singleton(LEDGERS, order.ledger), &booking)?;
        Ok(())
    }
}

async fn place(ctx: Context, Json(order): Json<Order>) -> Response {
    if order.ledger.is_empty() || order.ledger.len() > 100 {
        let detail = json!({ "detail": "an order names a ledger of 1 to 100 bytes" });
        return (StatusCode::BAD_REQUEST, Json(detail)).into_response();
    }
    match admit(&ctx, order).await {
        Ok(answer) => Json(answer).into_response(),
        Err(error) => error.into_response(),
    }
}

async fn admit(ctx: &Context, order: Order) -> Result<serde_json::Value, TrayError> {
    let orders = ctx.tray::<Orders>().await?;
    let n = order.n;
    let admission = orders.admit_once(&format!("order-{n}"), |orders| {
        orders.queue.push_back(order);
    })?;
    let repeat = admission.is_repeat();
    admission.receipt().await?;
    Ok(json!({ "placed": n, "repeat": repeat }))
}

struct Ledger;

impl Object for Ledger {
    async fn activate(_ctx: &Context) -> Result<Self, BoxError> {
        Ok(Ledger)
    }

    fn routes() -> pinned::Routes<Self> {
        Router::new().route("/lines", get(lines))
    }

    fn trays() -> Trays<Self> {
        Trays::new().singleton::<Book>().receives::<Book>()
    }
}

impl TrayHandler<Book> for Ledger {
    async fn handle(&self, ctx: TrayCtx<Book>, booking: Booking) -> Result<(), BoxError> {
        ctx.on_ack(move |book| {
            book.lines.push(format!("{}:{}", booking.shop, booking.n));
        });
        Ok(())
    }
}

async fn lines(ctx: Context) -> Result<Json<serde_json::Value>, TrayError> {
    let book = ctx.tray::<Book>().await?;
    let (lines, waiting, received) = book.read(|book| {
        let lines = (*book.lines).clone();
        (lines, book.inbox.len(), *book.received)
    });
    Ok(Json(
        json!({ "lines": lines, "waiting": waiting, "received": received }),
    ))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    pinned::logging::init();
    let location = std::env::var("DATABASE_URL").ok();
    let file = std::env::var("PINNED_DB_PATH").unwrap_or_else(|_| "pinned.db".into());
    let store = StoreConfig::from_location(location.as_deref(), file)?
        .open()
        .await?;
    let options = Options::from_env()
        .host::<Shop>("/shops")
        .host::<Ledger>(LEDGERS);
    let options = match std::env::var("ORDERS_DIE_AFTER_BOOKING") {
        Ok(n) => options.store(die_after_booking(store, n.parse()?)),
        Err(_) => options.store(store),
    };
    pinned::serve(options).await?;
    Ok(())
}

/// `store`, aborting the process once a ledger's row that admitted its
/// `n`-th booking has landed (the `ORDERS_DIE_AFTER_BOOKING` fixture).
fn die_after_booking<S: pinned::pinned_store::StateStore>(store: S, n: u64) -> AbortAfterWrite<S> {
    AbortAfterWrite::new(store, move |instance, tray, doc| {
        let received = doc.get("received").and_then(serde_json::Value::as_u64);
        instance.ns == LEDGERS && tray.tray_ns == Book::NAME && received.is_some_and(|r| r >= n)
    })
}
