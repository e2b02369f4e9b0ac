"""Label pairs of clips of the agent's play in a web page -- or, with --oracle, from true rewards.

    python 02_label_ui.py -d db/v0 [-d db/v1 ...]     # then open the printed http://localhost:8080/label?token=...
    python 02_label_ui.py -d db/v0 --oracle 300        # 300 synthetic labels, no server
    python 02_label_ui.py -d db/v1 --oracle 1000 --follow --recent 200   # label while 01_a2c.py records

Keys on the label page: 1 = #1 better, 2 = #2 better, 0 = equal, x = can't tell, u = undo,
r = new list, space = pause, + / - = speed. Answers go to <db>/labels.jsonl.
Listens on 127.0.0.1 unless --host is given. Every browser gives a token once: --token-file,
$RLHF_LABEL_TOKEN or --token, else one made at start and printed in the link (--no-token: none,
loopback only).
The page picks up segments written while it runs (so does --oracle N --follow); --recent N draws pairs from the N
newest segments only (by the step counter in the name). --follow keeps an oracle labelling new
clips at a schedule (--schedule, --label-rate per 1,000 agent steps, --poll) until N labels.
All logic lives in lib/label_ui/.
"""

from lib.label_ui.cli import main

if __name__ in {"__main__", "__mp_main__"}:
    main()
