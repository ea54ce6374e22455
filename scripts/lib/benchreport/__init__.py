"""The reports of the bench scripts (`python3 -m benchreport`, scripts/lib/common.sh benchreport): see __main__."""
