use super::Order;

/// The order as a list of ways, most recent first.
fn ways(order: u64, n: usize) -> Vec<u64> {
    (0..n).map(|i| (order >> (4 * i)) & 15).collect()
}

#[test]
fn recency_order_moves_ways_to_the_front() {
    for n in [1usize, 2, 3, 4, 8, 12, 15, 16] {
        let mut order = Order::initial(n);
        let mut model: Vec<u64> = (0..n as u64).rev().collect();
        assert_eq!(ways(order, n), model);
        let mut x = 12345u64;
        for _ in 0..500 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let way = if x >> 63 == 0 {
                let way = (x >> 40) % n as u64;
                order = Order::touch(order, way);
                model.retain(|&w| w != way);
                way
            } else {
                let way = Order::least_recent(order, n) as u64;
                assert_eq!(way, model[n - 1]);
                order = Order::refill(order, way, n);
                model.pop();
                way
            };
            model.insert(0, way);
            assert_eq!(ways(order, n), model, "{n} ways");
            assert_eq!(order >> (4 * n - 1) >> 1, 0, "no bits above the ways");
        }
    }
}
