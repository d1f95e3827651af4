"""Two `codemode dev` servers never share the bundled apps' stores (nor a runs file)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from durable_codemode.cli._serving import APP_DB_ENVS, DEV_SERVER_DB, _use_app_stores, dev_paths


def test_the_default_dev_server_keeps_its_files_where_they_were() -> None:
    assert dev_paths(None, 7233) == (DEV_SERVER_DB.expanduser(), None)


def test_another_port_or_db_gets_its_own_runs_file_and_app_stores(tmp_path: Path) -> None:
    runs, apps = dev_paths(None, 7300)
    assert runs == DEV_SERVER_DB.expanduser().with_name("dev-server-7300.sqlite")
    assert apps == runs.with_name("dev-server-7300-apps")
    own = tmp_path / "mine.sqlite"
    assert dev_paths(str(own), 7233) == (own, tmp_path / "mine-apps")
    assert len({dev_paths(None, 7233)[0], dev_paths(None, 7300)[0], dev_paths(None, 7301)[0]}) == 3
    assert dev_paths(None, 7300)[1] != dev_paths(None, 7301)[1]


def test_the_app_stores_go_in_the_servers_folder_unless_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for env in APP_DB_ENVS:
        monkeypatch.delenv(env, raising=False)
    monkeypatch.setenv("CODEMODE_CART_DB", "/somewhere/cart.sqlite")  # set by the user: it wins
    chosen = _use_app_stores(tmp_path)
    assert "CODEMODE_CART_DB" not in chosen and os.environ["CODEMODE_CART_DB"] == "/somewhere/cart.sqlite"
    assert os.environ["CODEMODE_INVENTORY_DB"] == str(tmp_path / "inventory.sqlite")
    assert set(chosen) == set(APP_DB_ENVS) - {"CODEMODE_CART_DB"}


def test_every_bundled_app_store_variable_is_known() -> None:
    """`APP_DB_ENVS` names each `*_DB_ENV` the bundled apps read, so a new app's store is moved too."""
    root = Path(__file__).resolve().parent.parent / "workflows"
    read = set(re.findall(r'_DB_ENV = "([A-Z_]+)"', "".join(p.read_text() for p in root.glob("*.py"))))
    assert read == set(APP_DB_ENVS)


@pytest.mark.parametrize("n", [2, 3, 5, 20, 50])
def test_every_stock_check_seed_has_a_line_to_remove(tmp_path: Path, n: int) -> None:
    """`codemode bench --apps cart --n 5,20` (docs/benchmarks.md) failed: N=5 drew no out-of-stock item."""
    from durable_codemode.apps.activities.cart import CartStore
    from durable_codemode.apps.activities.inventory import InventoryStore
    from durable_codemode.apps.workflows.cart_inventory import _seed

    cart, inventory = CartStore(tmp_path / "cart.sqlite"), InventoryStore(tmp_path / "inventory.sqlite")
    _seed(cart, inventory, n)
    stock = {f"({item['sku']})": item["on_hand"] for item in inventory.all_items()}
    with cart.connect() as conn:
        products = [row[0] for row in conn.execute("SELECT product FROM lines")]
    assert len(products) == n
    on_hand = [next(v for sku, v in stock.items() if p.endswith(sku)) for p in products]
    assert 0 in on_hand, f"N={n}: no line whose item is out of stock"
