"""A web page to watch durable runs live and decide the calls they wait on (`codemode ui`).

```python
from durable_codemode import connect
from durable_codemode.ui import UIAccess, serve_ui

client = await connect()
await serve_ui(client, access=UIAccess(approver="ana"))  # prints its address, with the session token
```

See docs/ui.md for what the page shows and how a decision from it is authenticated.
"""

from ._app import UIAccess, ui_app
from ._chat import chat_app
from ._codec_server import codec_server_app
from ._serve import DEFAULT_UI_PORT, serve_ui

__all__ = ["DEFAULT_UI_PORT", "UIAccess", "chat_app", "codec_server_app", "serve_ui", "ui_app"]
