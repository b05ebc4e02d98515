-- The seed database of the SQL server's fixture: a small shop. Built into shop.db by
-- `python -m launch.build_fixtures` (make servers).
CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, city TEXT NOT NULL, joined TEXT NOT NULL);
CREATE TABLE products (id INTEGER PRIMARY KEY, name TEXT NOT NULL, category TEXT NOT NULL, price REAL NOT NULL, stock INTEGER NOT NULL);
CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL REFERENCES customers(id),
                     product_id INTEGER NOT NULL REFERENCES products(id), quantity INTEGER NOT NULL,
                     status TEXT NOT NULL, ordered_on TEXT NOT NULL);
INSERT INTO customers VALUES
 (1, 'Alice Moreau', 'Lyon', '2023-02-11'), (2, 'Bruno Costa', 'Porto', '2023-03-05'),
 (3, 'Chen Wei', 'Lyon', '2023-04-19'), (4, 'Dana Novak', 'Prague', '2023-06-01'),
 (5, 'Emil Berg', 'Oslo', '2023-07-23'), (6, 'Farah Haddad', 'Porto', '2023-09-14'),
 (7, 'Gita Rao', 'Oslo', '2024-01-08'), (8, 'Hugo Laine', 'Helsinki', '2024-02-27'),
 (9, 'Ines Duarte', 'Lisbon', '2024-05-30'), (10, 'Jonas Weber', 'Prague', '2024-08-16');
INSERT INTO products VALUES
 (1, 'desk lamp', 'home', 24.5, 40), (2, 'wool blanket', 'home', 59.0, 12),
 (3, 'coffee grinder', 'kitchen', 45.0, 18), (4, 'chef knife', 'kitchen', 72.0, 9),
 (5, 'tea kettle', 'kitchen', 33.5, 25), (6, 'notebook', 'office', 4.2, 300),
 (7, 'fountain pen', 'office', 28.0, 55), (8, 'desk chair', 'office', 189.0, 6),
 (9, 'yoga mat', 'sport', 21.0, 70), (10, 'water bottle', 'sport', 12.5, 120),
 (11, 'running socks', 'sport', 9.9, 200), (12, 'plant pot', 'home', 14.0, 64);
INSERT INTO orders VALUES
 (1, 1, 3, 1, 'delivered', '2024-01-15'), (2, 1, 6, 10, 'delivered', '2024-01-15'),
 (3, 2, 9, 2, 'delivered', '2024-02-02'), (4, 3, 4, 1, 'shipped', '2024-03-11'),
 (5, 3, 5, 2, 'delivered', '2024-03-12'), (6, 4, 8, 1, 'cancelled', '2024-03-20'),
 (7, 4, 7, 3, 'delivered', '2024-04-02'), (8, 5, 2, 1, 'shipped', '2024-04-18'),
 (9, 5, 10, 4, 'delivered', '2024-05-06'), (10, 6, 1, 2, 'pending', '2024-05-21'),
 (11, 6, 12, 5, 'delivered', '2024-06-03'), (12, 7, 11, 6, 'shipped', '2024-06-19'),
 (13, 7, 3, 1, 'pending', '2024-07-07'), (14, 8, 6, 20, 'delivered', '2024-07-30'),
 (15, 8, 7, 1, 'cancelled', '2024-08-12'), (16, 9, 9, 1, 'delivered', '2024-09-01'),
 (17, 9, 5, 1, 'shipped', '2024-09-15'), (18, 10, 2, 2, 'pending', '2024-10-04'),
 (19, 10, 10, 3, 'delivered', '2024-10-20'), (20, 2, 12, 2, 'shipped', '2024-11-02'),
 (21, 1, 8, 1, 'pending', '2024-11-18'), (22, 3, 11, 4, 'delivered', '2024-12-01');
